//! fred's subscriber connection, where it carries the process's pub/sub
//! channel instead of fairlock's own grant connection (RedLock's
//! primaries): subscribing, and the messages and reconnects the grant
//! router (`grants.rs`) reads.

use std::borrow::Cow;

use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, EventInterface, PubsubInterface, Server, Value};
use tokio::sync::broadcast;

use super::{RedisConnection, Subscriber};
use crate::error::{Error, Result};

impl RedisConnection {
    /// fred's subscriber, if it carries the subscription.
    pub(super) fn fred_subscriber(&self) -> Option<&SubscriberClient> {
        match &self.subscriber {
            Subscriber::Fred(subscriber) => Some(subscriber),
            Subscriber::Own(_) => None,
        }
    }

    /// fred's subscriber, for `operation`: missing only when fairlock's own
    /// grant connection carries the subscription, where nothing asks for it.
    fn subscriber(&self, operation: &str) -> Result<&SubscriberClient> {
        self.fred_subscriber().ok_or_else(|| Error::InvalidOptions(format!(
            "{operation}: this client's pub/sub goes over fairlock's own grant connection, not fred's subscriber"
        )))
    }

    /// Subscribes the process's one subscriber connection to `channel`.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<()> {
        let subscriber = self.subscriber("SUBSCRIBE")?;
        self.bounded("SUBSCRIBE", Box::pin(subscriber.subscribe(channel)))
            .await?;
        // fred reports SUBSCRIBE done without reading Redis's answer, so a
        // refusal (NOPERM for the command or the channel) arrives as the
        // reply to the next command on that connection, or is dropped if
        // none is pending yet. Without this check a process whose
        // subscription was refused would connect, and its waiters would be
        // passed over by every handoff (nobody hears their grants). Redis
        // answers the PING after the SUBSCRIBE: with the refusal, or on a
        // RESP2 connection in subscribed mode with ["pong", ""] instead of
        // PONG. (On a cluster the PING may reach another node's
        // connection, and RESP3 answers PONG either way: only a refusal
        // that reaches the PING is seen there.)
        let pong = self
            .bounded("SUBSCRIBE", Box::pin(subscriber.ping::<Value>(None)))
            .await?;
        if self.clustered || self.resp3 || matches!(pong, Value::Array(_)) {
            return Ok(());
        }
        Err(Error::NoPermission(format!(
            "SUBSCRIBE {channel} was refused (the connection is not subscribed after it; \
             PING answered {pong:?}): the ACL user most likely lacks +subscribe or the channel"
        )))
    }

    /// Unsubscribes the subscriber connection from `channel`.
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<()> {
        self.bounded(
            "UNSUBSCRIBE",
            Box::pin(self.subscriber("UNSUBSCRIBE")?.unsubscribe(channel)),
        )
        .await
    }

    /// Subscribes a sharded channel (`SSUBSCRIBE`, routed by fred to the
    /// node that owns the channel's slot).
    pub(crate) async fn ssubscribe(&self, channel: &str) -> Result<()> {
        let subscriber = self.subscriber("SSUBSCRIBE")?;
        self.bounded("SSUBSCRIBE", Box::pin(subscriber.ssubscribe(channel)))
            .await
    }

    /// Messages arriving on fred's subscriber connection (`None` without
    /// one: see [`RedisConnection::grant_endpoint`]).
    pub(crate) fn messages(&self) -> Option<Messages> {
        self.fred_subscriber().map(|subscriber| Messages {
            rx: subscriber.message_rx(),
        })
    }

    /// Fires once per reconnect of fred's subscriber connection (`None`
    /// without one).
    pub(crate) fn subscriber_reconnects(&self) -> Option<Reconnects> {
        self.fred_subscriber().map(|subscriber| Reconnects {
            rx: subscriber.reconnect_rx(),
        })
    }
}

/// Pub/sub messages, each read where fred's reader left it.
pub(crate) struct Messages {
    rx: broadcast::Receiver<fred::types::Message>,
}

/// One pub/sub message. Its channel and payload are read in place: a
/// grant costs no copy of either.
pub(crate) struct PubSubMessage(fred::types::Message);

impl PubSubMessage {
    /// The channel it came on.
    pub(crate) fn channel(&self) -> &str {
        &self.0.channel
    }

    /// Its payload as text (our scripts publish text; anything else is
    /// rendered for the warning that names it).
    pub(crate) fn payload(&self) -> Cow<'_, str> {
        match &self.0.value {
            Value::String(s) => Cow::Borrowed(s),
            Value::Bytes(b) => String::from_utf8_lossy(b),
            other => Cow::Owned(format!("{other:?}")),
        }
    }
}

impl Messages {
    /// The next message, or `None` once the connection is closed for good.
    /// A lagging receiver skips what it missed and calls `on_lag`: a waiter
    /// heartbeat re-delivers every grant that a lost message carried.
    pub(crate) async fn recv(&mut self, mut on_lag: impl FnMut(u64)) -> Option<PubSubMessage> {
        loop {
            match self.rx.recv().await {
                Ok(message) => return Some(PubSubMessage(message)),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "fairlock pub/sub receiver lagged; re-checking all waiters"
                    );
                    on_lag(missed);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// Reconnect events of the subscriber connection.
pub(crate) struct Reconnects {
    rx: broadcast::Receiver<Server>,
}

impl Reconnects {
    /// Waits for the next reconnect; `false` once closed for good.
    pub(crate) async fn next(&mut self) -> bool {
        !matches!(
            self.rx.recv().await,
            Err(broadcast::error::RecvError::Closed)
        )
    }
}

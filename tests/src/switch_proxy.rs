//! A TCP proxy in front of one test redis-server that can be pointed at
//! another and cut every connection it carries: what a client behind one
//! address (a virtual IP, a DNS name, a load balancer) sees when the
//! server behind that address is replaced. The client reconnects to the
//! same address and reaches the new server. It can also let one command
//! through and drop its reply, closing that connection: a call that ran
//! but whose answer was lost with its connection, or hold back that one
//! reply for a while, or until the test lets it go: a call that ran and
//! is still in flight; and hold back every reply for a while: a slow
//! network, or a server slow to answer.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::silent_proxy::sends_subscribe;

/// The hold of [`SwitchProxy::hold_reply_until_passed`], in ms: until
/// [`SwitchProxy::pass_held_reply`].
const UNTIL_PASSED: u64 = u64::MAX;

/// What happens to the reply of the next command that carries a needle.
struct Armed {
    needle: Vec<u8>,
    /// `None`: the reply is dropped and its connection closed; otherwise
    /// the reply is held back this long (`Duration::MAX`: until passed).
    hold: Option<Duration>,
}

/// One connection through the proxy: its copying task, and whether the
/// client sent a `SUBSCRIBE` on it.
struct Flow {
    task: JoinHandle<()>,
    subscribed: Arc<AtomicBool>,
}

/// The proxy; it stops, and closes what it carries, when dropped.
pub struct SwitchProxy {
    port: u16,
    target: Arc<AtomicU16>,
    reply_delay_ms: Arc<AtomicU64>,
    flows: Arc<Mutex<Vec<Flow>>>,
    /// Bytes that, once seen in a command, make its reply be dropped and
    /// its connection closed ([`SwitchProxy::drop_reply_to`]), or held back
    /// ([`SwitchProxy::hold_reply_to`]).
    armed: Arc<Mutex<Option<Armed>>>,
    /// Set by [`SwitchProxy::pass_held_reply`].
    passed: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl SwitchProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target_port`.
    pub async fn start(target_port: u16) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let target = Arc::new(AtomicU16::new(target_port));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let flows: Arc<Mutex<Vec<Flow>>> = Arc::default();
        let armed: Arc<Mutex<Option<Armed>>> = Arc::default();
        let passed = Arc::new(AtomicBool::new(false));
        let accept = tokio::spawn({
            let (target, flows) = (Arc::clone(&target), Arc::clone(&flows));
            let armed = Arc::clone(&armed);
            let passed = Arc::clone(&passed);
            let reply_delay_ms = Arc::clone(&reply_delay_ms);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let port = target.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        continue;
                    };
                    let subscribed = Arc::new(AtomicBool::new(false));
                    let noted = Arc::clone(&subscribed);
                    let armed = Arc::clone(&armed);
                    let delay = Arc::clone(&reply_delay_ms);
                    let passed = Arc::clone(&passed);
                    let task = tokio::spawn(async move {
                        let (from_client, to_client) = client.into_split();
                        let (from_server, mut to_server) = server.into_split();
                        let mut to_client = to_client;
                        let cut = AtomicBool::new(false);
                        let hold = Hold {
                            ms: AtomicU64::new(0),
                            passed: &passed,
                        };
                        let forward = Forward {
                            subscribed: &noted,
                            armed: &armed,
                            cut: &cut,
                            hold_ms: &hold.ms,
                        };
                        // Either direction ending ends the flow; dropping
                        // the halves closes both sockets.
                        tokio::select! {
                            () = forward.run(from_client, &mut to_server) => {}
                            () = backward(from_server, &mut to_client, &cut, &hold, &delay) => {}
                        }
                    });
                    flows.lock().expect("flows").push(Flow { task, subscribed });
                }
            }
        });
        SwitchProxy {
            port,
            target,
            reply_delay_ms,
            flows,
            armed,
            passed,
            accept,
        }
    }

    /// The next command that carries `needle` (on any connection) reaches
    /// the server, but its reply never reaches the client: the proxy
    /// closes that connection when the reply comes. The client saw a call
    /// written and its connection lost before the answer, though the call
    /// ran. Once only.
    pub fn drop_reply_to(&self, needle: &str) {
        self.arm(needle, None);
    }

    /// The next command that carries `needle` (on any connection) reaches
    /// the server, and its reply reaches the client `hold` later: the call
    /// ran, and stays in flight that long. Replies behind it on the same
    /// connection wait too. Once only.
    pub fn hold_reply_to(&self, needle: &str, hold: Duration) {
        self.arm(needle, Some(hold));
    }

    /// As [`SwitchProxy::hold_reply_to`], but the reply is held until
    /// [`SwitchProxy::pass_held_reply`]: a call that ran and stays in
    /// flight until the test has checked what it needs meanwhile.
    pub fn hold_reply_until_passed(&self, needle: &str) {
        self.passed.store(false, Ordering::SeqCst);
        self.arm(needle, Some(Duration::MAX));
    }

    /// Lets the reply [`SwitchProxy::hold_reply_until_passed`] holds go
    /// on to the client.
    pub fn pass_held_reply(&self) {
        self.passed.store(true, Ordering::SeqCst);
    }

    fn arm(&self, needle: &str, hold: Option<Duration>) {
        *self.armed.lock().expect("needle") = Some(Armed {
            needle: needle.as_bytes().to_vec(),
            hold,
        });
    }

    /// Whether the command [`SwitchProxy::drop_reply_to`] or
    /// [`SwitchProxy::hold_reply_to`] waits for went through (its reply
    /// is, or will be, dropped or held back).
    pub fn reply_dropped(&self) -> bool {
        self.armed.lock().expect("needle").is_none()
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `target_port` from now on.
    pub fn switch_to(&self, target_port: u16) {
        self.target.store(target_port, Ordering::SeqCst);
    }

    /// Holds back each reply (each read from the server) this long before
    /// passing it on, on every connection, open or new.
    pub fn delay_replies(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.reply_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every connection open through the proxy.
    pub fn cut(&self) {
        for flow in self.flows.lock().expect("flows").drain(..) {
            flow.task.abort();
        }
    }

    /// How many connections open through the proxy (or closed by their
    /// ends, not by [`SwitchProxy::cut`]) sent a `SUBSCRIBE`.
    pub fn subscribed_connections(&self) -> usize {
        self.flows
            .lock()
            .expect("flows")
            .iter()
            .filter(|flow| flow.subscribed.load(Ordering::SeqCst))
            .count()
    }

    /// Closes the connections that subscribed (pub/sub), leaving the
    /// others open.
    pub fn cut_subscribers(&self) {
        self.flows.lock().expect("flows").retain(|flow| {
            let subscribed = flow.subscribed.load(Ordering::SeqCst);
            if subscribed {
                flow.task.abort();
            }
            !subscribed
        });
    }
}

/// What the client-to-server half of a flow notes and shares.
struct Forward<'a> {
    /// Set when the client sent a `SUBSCRIBE`.
    subscribed: &'a AtomicBool,
    /// The proxy's needle of [`SwitchProxy::drop_reply_to`] or
    /// [`SwitchProxy::hold_reply_to`].
    armed: &'a Mutex<Option<Armed>>,
    /// Set when this flow carried a needle to drop the reply to: the
    /// server's next bytes close it instead of reaching the client.
    cut: &'a AtomicBool,
    /// Set when this flow carried a needle to hold the reply to: the
    /// server's next bytes are held back this long.
    hold_ms: &'a AtomicU64,
}

impl Forward<'_> {
    /// Copies the client's bytes to the server, noting a `SUBSCRIBE` and
    /// the needle.
    async fn run(self, mut from: OwnedReadHalf, to: &mut OwnedWriteHalf) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sends_subscribe(&buf[..n]) {
                self.subscribed.store(true, Ordering::SeqCst);
            }
            let carried = {
                let mut armed = self.armed.lock().expect("needle");
                let carried = armed.as_ref().is_some_and(|armed| {
                    buf[..n]
                        .windows(armed.needle.len())
                        .any(|window| window == armed.needle)
                });
                if carried {
                    armed.take().map(|armed| armed.hold)
                } else {
                    None
                }
            };
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            // Only once the command is written: both halves run in one
            // task, so the reply cannot be read before this.
            match carried {
                Some(None) => self.cut.store(true, Ordering::SeqCst),
                Some(Some(hold)) => {
                    let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
                    self.hold_ms.store(ms, Ordering::SeqCst);
                }
                None => {}
            }
        }
    }
}

/// The hold of one flow: set when it carried a needle to hold the reply
/// to, in ms ([`UNTIL_PASSED`]: until `passed` is set).
struct Hold<'a> {
    ms: AtomicU64,
    passed: &'a AtomicBool,
}

/// Copies the server's bytes to the client, each read held back by the
/// delay set then, until the flow is to be cut: then the bytes read (the
/// reply to the marked command) are dropped and the flow ends. The first
/// read after a command marked to hold its reply is held back that long,
/// or until passed.
async fn backward(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    cut: &AtomicBool,
    hold: &Hold<'_>,
    delay_ms: &AtomicU64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            return;
        }
        let mut held = hold.ms.swap(0, Ordering::SeqCst);
        if held == UNTIL_PASSED {
            while !hold.passed.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            held = 0;
        }
        let delay = delay_ms.load(Ordering::SeqCst) + held;
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

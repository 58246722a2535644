//! The client's spans follow the OpenTelemetry conventions: a capturing
//! `tracing` layer records every span of a contended acquire, a timed-out
//! one and a busy `try_lock`, and checks their names, kinds, status,
//! `fairlock.*` attributes, the Redis client spans inside, and that the
//! acquire span sits inside the caller's own span (so a lock wait shows
//! up inside a request's trace).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::LockOptions;
use fairlock_tests::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Instrument, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A closed span: its name, its fields as text, and its parent's name.
#[derive(Debug, Clone)]
struct Closed {
    name: String,
    fields: BTreeMap<String, String>,
    parent: Option<String>,
}

impl Closed {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Closed>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span
            .extensions_mut()
            .remove::<Fields>()
            .unwrap_or_default()
            .0;
        let closed = Closed {
            name: span.name().to_owned(),
            fields,
            parent: span.parent().map(|p| p.name().to_owned()),
        };
        self.0.lock().expect("capture").push(closed);
    }
}

#[test]
fn acquire_spans_follow_the_opentelemetry_conventions() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    // One thread: every span of the test and of the client is captured.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = server();
    runtime.block_on(async {
        let client = client(&server).await;
        let holder = client.lock("traced").await.expect("holder");

        // A request waits for the lock inside its own span.
        let waiter = {
            let client = client.clone();
            let request = tracing::info_span!("http.request", http.route = "/pay");
            tokio::spawn(
                async move { client.lock("traced").await.map(|g| g.token().value()) }
                    .instrument(request),
            )
        };
        wait_for_queue_len(&client, "traced", 1).await;
        let timed_out = client
            .lock_with(
                "traced",
                LockOptions::new().wait_timeout(Duration::from_millis(100)),
            )
            .await;
        assert!(timed_out.is_err(), "{timed_out:?}");
        assert!(client.try_lock("traced").await.expect("try").is_none());
        holder.release().await.expect("release");
        let token = waiter.await.expect("task").expect("waiter granted");
        assert!(token > 0);
        client.shutdown().await;
    });
    drop(runtime);

    let spans = capture.0.lock().expect("capture").clone();
    let acquires: Vec<&Closed> = spans
        .iter()
        .filter(|s| s.name == "fairlock.acquire")
        .collect();
    assert_eq!(acquires.len(), 4, "{acquires:#?}");
    for span in &acquires {
        assert_eq!(span.field("otel.kind"), Some("internal"));
        assert_eq!(span.field("fairlock.lock.name"), Some("traced"));
    }
    let outcome = |o: &str| -> Vec<&&Closed> {
        acquires
            .iter()
            .filter(|s| s.field("fairlock.outcome") == Some(o))
            .collect()
    };

    // The holder: granted at once, a token, no ticket, no error status.
    // The request's waiter: queued first (position 0) with a ticket, then
    // granted with a greater token, inside the request's span.
    let acquired = outcome("acquired");
    assert_eq!(acquired.len(), 2, "{acquires:#?}");
    let waited = acquired
        .iter()
        .find(|s| s.parent.as_deref() == Some("http.request"))
        .expect("the waiter's acquire span is inside the request span");
    assert_eq!(waited.field("fairlock.queue.position"), Some("0"));
    assert!(waited.field("fairlock.ticket").is_some(), "{waited:?}");
    let first = acquired
        .iter()
        .find(|s| s.parent.is_none())
        .expect("the holder's acquire span");
    assert_eq!(first.field("fairlock.ticket"), None);
    let token = |s: &Closed| -> u64 {
        s.field("fairlock.token")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no token on {s:?}"))
    };
    assert!(token(waited) > token(first));
    for span in &acquired {
        assert_eq!(span.field("otel.status_code"), None, "{span:?}");
    }

    // The timed-out acquire is an error; a busy try_lock is not.
    let timeout = outcome("timeout");
    assert_eq!(timeout.len(), 1, "{acquires:#?}");
    assert_eq!(timeout[0].field("otel.status_code"), Some("ERROR"));
    assert_eq!(timeout[0].field("error.type"), Some("timeout"));
    assert_eq!(timeout[0].field("fairlock.acquire.mode"), Some("wait"));
    let busy = outcome("busy");
    assert_eq!(busy.len(), 1, "{acquires:#?}");
    assert_eq!(busy[0].field("fairlock.acquire.mode"), Some("try"));
    assert_eq!(busy[0].field("otel.status_code"), None);

    // Redis calls are database client spans, inside the acquire span.
    let scripts: Vec<&Closed> = spans.iter().filter(|s| s.name == "redis.script").collect();
    let acquire_calls: Vec<&&Closed> = scripts
        .iter()
        .filter(|s| s.field("db.stored_procedure.name") == Some("acquire"))
        .collect();
    assert!(acquire_calls.len() >= 4, "{scripts:#?}");
    for call in &acquire_calls {
        assert_eq!(call.field("otel.kind"), Some("client"));
        assert_eq!(call.field("db.system.name"), Some("redis"));
        assert_eq!(call.field("db.operation.name"), Some("EVALSHA"));
        assert_eq!(call.field("otel.name"), Some("EVALSHA acquire"));
        assert_eq!(call.parent.as_deref(), Some("fairlock.acquire"));
    }
}

//! The Prometheus exporter (feature `prometheus`): a recorder plus an HTTP
//! listener that serves the text exposition format.
//!
//! The listener runs on a thread of its own with a one-thread Tokio
//! runtime, not on the application's runtime: a scrape is then answered
//! even when the application's runtime is saturated or blocked, which is
//! exactly when the lock metrics matter most. It costs one mostly idle
//! thread.

use std::net::SocketAddr;
use std::sync::mpsc;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

pub use metrics_exporter_prometheus::PrometheusHandle;

use crate::{describe_metrics, HOLD_SECONDS, SECONDS_BUCKETS, WAIT_SECONDS};

/// Why the Prometheus exporter could not be installed. Nothing is left
/// running after an error: no listener, no thread, no recorder.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The HTTP listener could not bind its address.
    #[error("cannot serve Prometheus metrics on {addr}: {reason}; choose a free port on a local address")]
    Listen {
        /// The address that was asked for.
        addr: SocketAddr,
        /// What the operating system said.
        reason: String,
    },
    /// A metrics recorder is already installed: recorders are process-wide
    /// and set once.
    #[error("a metrics recorder is already installed in this process; call install_prometheus once per process, or keep your recorder and call fairlock_metrics::describe_metrics() after installing it")]
    AlreadyInstalled,
    /// The exporter's thread or its runtime could not be started.
    #[error("cannot start the Prometheus exporter thread: {0}")]
    Runtime(String),
    /// The exporter refused its configuration.
    #[error("the Prometheus exporter refused its configuration: {0}")]
    Exporter(String),
}

/// A [`PrometheusBuilder`] with fairlock's histogram buckets
/// ([`SECONDS_BUCKETS`] for [`WAIT_SECONDS`] and [`HOLD_SECONDS`]) and
/// nothing else: for applications that configure the exporter themselves
/// (global labels, other metrics' buckets, their own listener). Call
/// [`describe_metrics`] after installing it.
///
/// Without these buckets the exporter would render the two histograms as
/// summaries, which cannot be aggregated across processes.
pub fn prometheus_builder() -> Result<PrometheusBuilder, MetricsError> {
    let mut builder = PrometheusBuilder::new();
    for name in [WAIT_SECONDS, HOLD_SECONDS] {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), &SECONDS_BUCKETS)
            .map_err(|error| MetricsError::Exporter(error.to_string()))?;
    }
    Ok(builder)
}

/// Installs a Prometheus recorder as the process's global metrics recorder
/// and serves it over HTTP on `addr` (`GET /metrics`; any path but
/// `/health` answers with the metrics). Also calls [`describe_metrics`]
/// and sets fairlock's histogram buckets (see [`prometheus_builder`]).
///
/// Works inside or outside a Tokio runtime. Call it once per process,
/// before creating the first `LockClient` (metrics recorded before it are
/// not exported). Bind a loopback or private address: the endpoint has no
/// authentication. Port 0 is refused, as the chosen port could not be
/// reported back.
///
/// The returned handle renders the same text in-process
/// ([`PrometheusHandle::render`]).
///
/// # Errors
///
/// [`MetricsError::Listen`] if `addr` cannot be bound (or has port 0),
/// [`MetricsError::AlreadyInstalled`] if a recorder is already installed,
/// [`MetricsError::Runtime`] if the exporter thread cannot start.
pub fn install_prometheus(addr: SocketAddr) -> Result<PrometheusHandle, MetricsError> {
    if addr.port() == 0 {
        return Err(MetricsError::Listen {
            addr,
            reason: "port 0 picks a port that cannot be reported back".to_owned(),
        });
    }
    let builder = prometheus_builder()?.with_http_listener(addr);
    // The exporter's runtime is built, used and dropped on its own thread
    // only: dropping a runtime on the caller's thread (after a failed bind)
    // panics when the caller is async code.
    let (built_tx, built) = mpsc::channel();
    let (start, started) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("fairlock-metrics-exporter".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = built_tx.send(Err(MetricsError::Runtime(error.to_string())));
                    return;
                }
            };
            // `build` binds the listener at once and must run inside a runtime.
            let exporter = {
                let _entered = runtime.enter();
                match builder.build() {
                    Ok((recorder, exporter)) => {
                        if built_tx.send(Ok(recorder)).is_err() {
                            return;
                        }
                        exporter
                    }
                    Err(error) => {
                        let _ = built_tx.send(Err(match error {
                            BuildError::FailedToCreateHTTPListener(reason) => {
                                MetricsError::Listen { addr, reason }
                            }
                            other => MetricsError::Exporter(other.to_string()),
                        }));
                        return;
                    }
                }
            };
            // Serves only once the recorder is installed; if installing
            // fails, the dropped sender ends the thread, and with it the
            // runtime, the listener and the exporter's upkeep task.
            if started.recv().is_ok() {
                if let Err(error) = runtime.block_on(exporter) {
                    tracing::error!(?error, "fairlock's Prometheus exporter stopped");
                }
            }
        })
        .map_err(|error| MetricsError::Runtime(error.to_string()))?;
    let recorder = built.recv().map_err(|_| {
        MetricsError::Runtime("the exporter thread ended before starting".to_owned())
    })??;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    // The thread only ends early if it panicked; the recorder still works
    // then, through the handle.
    let _ = start.send(());
    describe_metrics();
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_is_refused() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        assert!(matches!(
            install_prometheus(addr),
            Err(MetricsError::Listen { .. })
        ));
    }

    /// Called from async code (`#[tokio::main]`), a failed install must
    /// come back as an error: dropping a runtime there panics.
    #[test]
    fn a_taken_port_is_a_listen_error_inside_a_runtime_too() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let addr = taken.local_addr().expect("local addr");
        let app = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("the application's runtime");
        let result = app.block_on(async { install_prometheus(addr) });
        assert!(
            matches!(result, Err(MetricsError::Listen { addr: reported, .. }) if reported == addr),
            "{result:?}"
        );
    }

    /// A hold or wait of minutes (a batch job under a de-duplication
    /// lock) lands in a finite bucket, so its quantiles and the
    /// held-too-long alert can see it; it once fell past the last (60 s).
    #[test]
    fn holds_of_minutes_land_in_finite_buckets() {
        let recorder = prometheus_builder().expect("builder").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!(HOLD_SECONDS).record(600.0);
            metrics::histogram!(WAIT_SECONDS, "outcome" => "acquired").record(1500.0);
        });
        let text = handle.render();
        assert!(
            text.contains(r#"fairlock_hold_seconds_bucket{le="600"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"fairlock_wait_seconds_bucket{outcome="acquired",le="1800"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn a_taken_port_is_a_listen_error_and_installs_nothing() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let addr = taken.local_addr().expect("local addr");
        match install_prometheus(addr) {
            Err(MetricsError::Listen { addr: reported, .. }) => assert_eq!(reported, addr),
            other => panic!("expected a listen error, got {other:?}"),
        }
        // Nothing was installed: the global recorder is still free.
        assert!(metrics::set_global_recorder(metrics::NoopRecorder).is_ok());
        // The fairlock buckets apply.
        let recorder = prometheus_builder().expect("builder").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!(WAIT_SECONDS, "outcome" => "acquired").record(0.003);
        });
        let text = handle.render();
        assert!(
            text.contains(r#"fairlock_wait_seconds_bucket{outcome="acquired",le="0.005"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"fairlock_wait_seconds_bucket{outcome="acquired",le="0.0025"} 0"#),
            "{text}"
        );
    }
}

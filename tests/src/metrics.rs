//! The Prometheus exporter the metric tests read, and reading it.

use std::time::Duration;

use fairlock_metrics::PrometheusHandle;

/// The value of metric `name` in this process's exporter, summed over its
/// series; `None` before anything recorded it.
pub fn metric_value(metrics: &PrometheusHandle, name: &str) -> Option<f64> {
    let text = metrics.render();
    let values: Vec<f64> = text
        .lines()
        .filter(|line| {
            let series = line.split([' ', '{']).next();
            series == Some(name)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Waits until metric `name` in this process's exporter reads `value`.
///
/// A waiting task records its contention once its acquire reply arrives,
/// which can be after [`wait_for_queue_len`] has already seen the queue
/// grow in Redis: a test that needs those records in queue order waits for
/// the count too.
pub async fn wait_for_metric(metrics: &PrometheusHandle, name: &str, value: f64) {
    for _ in 0..2000 {
        if metric_value(metrics, name) == Some(value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "{name} never read {value}: {:?}",
        metric_value(metrics, name)
    );
}

/// Installs fairlock's Prometheus exporter on a free loopback port and
/// returns its address and a handle to render it in-process. The port is found by binding port 0 and closing it
/// again, so another process may take it in between: retry a few times.
pub fn install_exporter() -> (std::net::SocketAddr, PrometheusHandle) {
    for _ in 0..5 {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port");
        match fairlock_metrics::install_prometheus(addr) {
            Ok(handle) => return (addr, handle),
            Err(fairlock_metrics::MetricsError::Listen { .. }) => continue,
            Err(error) => panic!("cannot install the exporter: {error}"),
        }
    }
    panic!("no free port for the exporter after 5 tries");
}

//! A Prometheus recorder local to one test: tests that count what the
//! client records (`metrics_outcomes.rs`, `redlock_metrics.rs`) each set
//! one as the default of their thread and run on a current-thread runtime,
//! so every task of the client records there and no other test's counts
//! mix in.

use fairlock_metrics::PrometheusHandle;

/// A Prometheus recorder of this test's own, as its thread's default.
pub struct LocalMetrics {
    handle: PrometheusHandle,
    _guard: metrics::LocalRecorderGuard<'static>,
}

impl LocalMetrics {
    /// Installs a recorder with fairlock's buckets as this thread's
    /// default, for as long as the value lives.
    pub fn install() -> Self {
        let recorder = fairlock_metrics::prometheus_builder()
            .expect("fairlock's buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Leaked: the guard needs a recorder that outlives it; one small
        // recorder per test is nothing.
        let recorder: &'static _ = Box::leak(Box::new(recorder));
        Self {
            handle,
            _guard: metrics::set_default_local_recorder(recorder),
        }
    }

    /// The recorder's handle, to render or read what it holds.
    pub fn handle(&self) -> &PrometheusHandle {
        &self.handle
    }

    /// `name` summed over its series that carry every `label="value"` of
    /// `labels` (0 when there is none).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let wanted: Vec<String> = labels
            .iter()
            .map(|(label, value)| format!("{label}=\"{value}\""))
            .collect();
        self.handle
            .render()
            .lines()
            .filter(|line| line.split([' ', '{']).next() == Some(name))
            .filter(|line| wanted.iter().all(|w| line.contains(w.as_str())))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |sum, value| sum + value)
    }

    /// `name` summed over all its series (0 when it does not exist).
    pub fn total(&self, name: &str) -> f64 {
        self.value(name, &[])
    }
}

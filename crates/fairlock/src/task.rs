//! Background tasks as owned values with an explicit shutdown.
//!
//! Each of the client's background jobs (grant routing, waiter heartbeat,
//! lease watchdog) is a [`BackgroundTask`]: the client owns it, asks it to
//! stop with [`BackgroundTask::shutdown`], and waits until it has. A task
//! sees the request through its [`ShutdownSignal`] between two rounds of
//! work, so it never stops half way through a Redis call's bookkeeping.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long shutdown waits for a task to finish its round before aborting it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A task's view of the shutdown request.
#[derive(Clone)]
pub(crate) struct ShutdownSignal {
    rx: watch::Receiver<bool>,
}

impl ShutdownSignal {
    /// Resolves once shutdown was asked for (at once if it already was).
    pub(crate) async fn requested(&mut self) {
        // An error means the owner is gone: stop too.
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

/// A spawned background job and the means to stop it.
pub(crate) struct BackgroundTask {
    name: &'static str,
    stop: watch::Sender<bool>,
    handle: Option<JoinHandle<()>>,
}

impl BackgroundTask {
    /// Spawns `job`, handing it the signal it must watch.
    pub(crate) fn spawn<F, Fut>(name: &'static str, job: F) -> Self
    where
        F: FnOnce(ShutdownSignal) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, rx) = watch::channel(false);
        let handle = tokio::spawn(job(ShutdownSignal { rx }));
        Self {
            name,
            stop,
            handle: Some(handle),
        }
    }

    /// Whether the task has not ended yet.
    pub(crate) fn is_running(&self) -> bool {
        self.handle
            .as_ref()
            .is_some_and(|handle| !handle.is_finished())
    }

    /// Asks the task to stop and waits until it has (aborting it after a
    /// grace period if it does not).
    pub(crate) async fn shutdown(&mut self) {
        self.stop.send_replace(true);
        if let Some(mut handle) = self.handle.take() {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut handle)
                .await
                .is_err()
            {
                tracing::warn!(
                    task = self.name,
                    "fairlock background task did not stop in time; aborted"
                );
                handle.abort();
            }
        }
    }
}

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        // Dropped without shutdown (the client went away): ask it to stop;
        // it ends after its current round.
        self.stop.send_replace(true);
    }
}

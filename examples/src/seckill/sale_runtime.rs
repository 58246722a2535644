//! The runtime the sales run on, apart from the one serving HTTP.
//!
//! At ten thousand connections the HTTP runtime's run queue holds
//! thousands of request tasks. A task woken by a Redis reply joins the back
//! of that queue, so every round trip of a sale (the grant, three fenced
//! calls, the release) waited behind the whole queue: a pass that takes
//! half a millisecond at a thousand connections took hundreds of
//! milliseconds, and the item was sold a few times a second.
//!
//! [`SaleRuntime`] is a small tokio runtime of its own. The Redis clients
//! connect on it, so their socket tasks and the tasks their replies wake
//! live there, and each sale runs there as one task: its round trips wait
//! only behind other sales. The HTTP handler waits for the sale's answer,
//! one wake-up on the busy runtime per request.
//!
//! Dropping it shuts its threads down without waiting for running sales
//! (call [`crate::seckill::http::Service::close`] first for a clean stop).

use std::future::Future;

use tokio::runtime::{Builder, Runtime};

use super::BoxError;

/// A tokio runtime for the sales, with `threads` worker threads.
#[derive(Debug)]
pub struct SaleRuntime {
    runtime: Option<Runtime>,
}

impl SaleRuntime {
    /// Starts the runtime with `threads` workers (at least one).
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("seckill-sales")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `work` on the sale runtime and waits for its output. The work
    /// goes on to its end even if the caller stops waiting (an HTTP client
    /// that hung up still gets its sale counted, and a held lock is
    /// released).
    pub async fn run<F>(&self, work: F) -> Result<F::Output, BoxError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or("the sale runtime is shut down")?;
        Ok(runtime.spawn(work).await?)
    }
}

impl Drop for SaleRuntime {
    fn drop(&mut self) {
        // A runtime may not be dropped (which blocks) inside another
        // runtime: let its threads go in the background.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

//! The hold inside the critical section: an async wait that is precise to
//! tens of microseconds and the same for every implementation.
//!
//! `tokio::time::sleep` rounds up to its driver's 1 ms tick, so a 1 ms
//! hold lasted 1 to 2+ ms, and how long depended on where the grant fell
//! between two ticks. That phase differs between locks, so one H gave each
//! implementation a different hold (fairlock 2.5 ms, rslock 2.1-2.35 ms
//! measured at H=1 ms) and the H=1 ms throughputs did not compare locks
//! alone.
//!
//! A hold here is a Linux timerfd (`CLOCK_MONOTONIC`, relative, one-shot):
//! the kernel fires it from a high-resolution timer, without the timer
//! slack that `nanosleep` and `epoll_wait` timeouts get. It is wrapped in
//! tokio's [`AsyncFd`], so the holder parks like any other I/O wait: no
//! worker thread blocks, and there is no thread per holder (the 1,000-lock
//! cell has up to 1,000 holders at once). The holder wakes when the I/O
//! driver sees the fd readable, tens of µs after expiry on an idle machine;
//! under load it waits for a worker like every other wake-up does.
//!
//! The timer fds are pooled per cell ([`HoldTimers`]) and re-armed, so a
//! hold costs two system calls (arm, read), not six (create, register,
//! arm, read, deregister, close); the pool grows to the most holds at once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A non-blocking one-shot `CLOCK_MONOTONIC` timer fd.
struct TimerFd(OwnedFd);

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl TimerFd {
    fn new() -> io::Result<TimerFd> {
        // SAFETY: a plain system call; the descriptor it returns is owned
        // by the OwnedFd below and nowhere else.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Arms the timer to fire once, `after` from now (at least 1 ns: a
    /// zero value would disarm it).
    fn arm(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(after.as_secs())
                    .map_err(|_| io::Error::other("hold too long for a timerfd"))?,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the fd is a timerfd we own; `spec` outlives the call and
        // the old value is not asked for.
        let result =
            unsafe { libc::timerfd_settime(self.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes the expiration: `WouldBlock` if the timer has not fired.
    fn read_expiration(&self) -> io::Result<()> {
        let mut expirations = 0u64;
        // SAFETY: reads at most 8 bytes into a u64 we own.
        let read = unsafe {
            libc::read(
                self.as_raw_fd(),
                (&mut expirations as *mut u64).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            )
        };
        match read {
            8 => Ok(()),
            n if n < 0 => Err(io::Error::last_os_error()),
            n => Err(io::Error::other(format!("timerfd: read {n} bytes, not 8"))),
        }
    }
}

/// Precise holds for the contenders of one cell (or one worker process):
/// a pool of timer fds, one per hold in progress.
#[derive(Default)]
pub struct HoldTimers {
    idle: Mutex<Vec<AsyncFd<TimerFd>>>,
}

impl HoldTimers {
    /// Waits `hold` (never less; more by the wake-up latency), without
    /// blocking the worker thread. A zero hold returns at once.
    pub async fn hold(&self, hold: Duration) -> io::Result<()> {
        if hold.is_zero() {
            return Ok(());
        }
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let timer = match idle {
            Some(timer) => timer,
            // SAFETY: the TimerFd owns its descriptor and keeps it open,
            // the same one from `as_raw_fd`, for as long as it lives, and
            // the AsyncFd owns the TimerFd.
            None => unsafe {
                AsyncFd::register_with_interest(TimerFd::new()?, Interest::READABLE)?
            },
        };
        timer.get_ref().arm(hold)?;
        loop {
            let mut ready = timer.readable().await?;
            // `try_io` clears the readiness on `WouldBlock`: a readiness
            // left from this fd's previous hold, or a spurious wake-up.
            if let Ok(fired) = ready.try_io(|timer| timer.get_ref().read_expiration()) {
                fired?;
                // The expiration is consumed: the next hold on this fd
                // waits for its own edge.
                ready.clear_ready();
                break;
            }
        }
        // Only a timer that fired and was read goes back: it is disarmed.
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(timer);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_are_never_short_and_close_to_the_asked_time() {
        let timers = HoldTimers::default();
        let hold = Duration::from_millis(1);
        let mut lengths = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            timers.hold(hold).await.expect("timerfd hold");
            lengths.push(started.elapsed());
        }
        lengths.sort();
        assert!(lengths[0] >= hold, "shortest hold {:?}", lengths[0]);
        // A loaded test machine may delay some wake-ups (a busy CI runner
        // by some hundreds of µs); the median still must not drift by a
        // whole tokio tick, as a tokio sleep's does.
        let median = lengths[lengths.len() / 2];
        assert!(
            median < hold + Duration::from_micros(900),
            "median hold {median:?}"
        );
        // One fd served every sequential hold.
        assert_eq!(timers.idle.lock().map(|v| v.len()).unwrap_or(0), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_holds_each_get_a_timer() {
        let timers = std::sync::Arc::new(HoldTimers::default());
        let started = Instant::now();
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let timers = std::sync::Arc::clone(&timers);
                tokio::spawn(async move { timers.hold(Duration::from_millis(5)).await })
            })
            .collect();
        for task in tasks {
            task.await.expect("join").expect("hold");
        }
        assert!(started.elapsed() >= Duration::from_millis(5));
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}

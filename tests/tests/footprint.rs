//! What waiting costs the caller's memory. A task that awaits `lock()` and
//! then `release()` carries both futures in its state for its whole wait,
//! so both must be small: ten thousand waiting tasks should cost a few
//! KiB each, not ten. (An unboxed replica-acknowledgement wait once made
//! `release()` 10,896 bytes, and every waiting task with it.)

use std::mem::size_of_val;

use fairlock_tests::*;

/// Bounds far below the regression above. `lock()` is 624 B in debug
/// and release builds alike (952 B before its arguments stopped being
/// kept twice, its wait stopped keeping a select's futures and a
/// `Notify`, and its script call was boxed with its arguments); 672
/// catches one error or reply kept in scope across the wait again.
/// `release()` boxes its Redis call: 80 B.
const LOCK_FUTURE_MAX: usize = 672;
const RELEASE_FUTURE_MAX: usize = 128;
/// A semaphore's `acquire()` is 664 B, a read-write lock's `read()` and
/// `write()` 680 B (784 and 856 B before their entry points stopped
/// keeping their arguments twice).
const PERMIT_FUTURE_MAX: usize = 720;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_futures_a_waiting_task_carries_are_small() {
    let server = server();
    let client = client(&server).await;
    let guard = client.lock("footprint:a").await.expect("lock");

    let lock = client.lock("footprint:b");
    let lock_size = size_of_val(&lock);
    drop(lock);
    let release = guard.release();
    let release_size = size_of_val(&release);
    release.await.expect("release");
    eprintln!("lock() future {lock_size} B, release() future {release_size} B");
    assert!(
        lock_size <= LOCK_FUTURE_MAX,
        "lock() future is {lock_size} B"
    );
    assert!(
        release_size <= RELEASE_FUTURE_MAX,
        "release() future is {release_size} B"
    );

    let semaphore = client.semaphore("footprint:s", 2).expect("semaphore");
    let acquire = semaphore.acquire();
    let acquire_size = size_of_val(&acquire);
    drop(acquire);
    let rwlock = client.rw_lock("footprint:rw").expect("rw_lock");
    let (read, write) = (rwlock.read(), rwlock.write());
    let (read_size, write_size) = (size_of_val(&read), size_of_val(&write));
    drop((read, write));
    eprintln!("semaphore acquire() {acquire_size} B, read() {read_size} B, write() {write_size} B");
    for (what, size) in [
        ("acquire", acquire_size),
        ("read", read_size),
        ("write", write_size),
    ] {
        assert!(size <= PERMIT_FUTURE_MAX, "{what}() future is {size} B");
    }
    let permit = semaphore.acquire().await.expect("permit");
    let release = permit.release();
    let permit_release_size = size_of_val(&release);
    release.await.expect("permit release");
    eprintln!("permit release() future {permit_release_size} B");
    assert!(
        permit_release_size <= RELEASE_FUTURE_MAX,
        "permit release() future is {permit_release_size} B"
    );
}

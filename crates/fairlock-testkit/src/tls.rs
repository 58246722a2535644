//! TLS material for a test server: a throwaway certificate authority and a
//! server certificate for `127.0.0.1` and `localhost`, made with the
//! `openssl` command-line tool (installed with apt-get when missing, like
//! redis-server). Clients trust the authority through `SSL_CERT_FILE`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::TestkitError;
use crate::install::ensure_debian_binaries;
use crate::process::fresh_temp_dir;

/// A CA and a server certificate it signed, in a temporary directory that
/// is removed on drop.
#[derive(Debug)]
pub struct TlsFiles {
    dir: PathBuf,
}

impl TlsFiles {
    /// Makes a new CA (valid 2 days, P-256 keys) and a server certificate
    /// for `IP:127.0.0.1` and `DNS:localhost` signed by it.
    ///
    /// The certificate is good for client authentication too: with
    /// `tls-cluster yes` cluster nodes present it to each other on the
    /// cluster bus, which always asks the connecting node for a certificate
    /// (`tls-auth-clients` does not apply to the bus) and refuses a
    /// certificate meant for servers only.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] without `openssl` (and no way to
    /// install it), [`TestkitError::StartFailed`] if `openssl` fails.
    pub fn generate() -> Result<Self, TestkitError> {
        let openssl = ensure_debian_binaries(&["openssl"], "openssl")
            .map_err(TestkitError::NotInstalled)?
            .remove(0);
        let files = Self {
            dir: fresh_temp_dir()?,
        };
        fs::write(
            files.dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             basicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let steps: [Vec<&str>; 3] = [
            [
                &["req", "-x509", "-nodes", "-days", "2"][..],
                &key,
                &["-keyout", "ca.key", "-out", "ca.crt"],
                &["-subj", "/CN=fairlock test CA"],
                &["-addext", "basicConstraints=critical,CA:TRUE"],
                &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ]
            .concat(),
            [
                &["req", "-nodes"][..],
                &key,
                &["-keyout", "server.key", "-out", "server.csr"],
                &["-subj", "/CN=localhost"],
            ]
            .concat(),
            vec![
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        ];
        for args in steps {
            let out = Command::new(&openssl)
                .args(&args)
                .current_dir(&files.dir)
                .output()?;
            if !out.status.success() {
                return Err(TestkitError::StartFailed {
                    log_tail: format!(
                        "openssl {}: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                });
            }
        }
        Ok(files)
    }

    /// The CA certificate (PEM): what `SSL_CERT_FILE` should name.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Makes this process trust the CA from now on: points `SSL_CERT_FILE`
    /// at it, which the TLS setup of every client made afterwards reads.
    ///
    /// Setting the environment is racy in principle (not `unsafe` in
    /// edition 2021): call it before any client exists, from a test binary
    /// or program where no other thread reads the environment meanwhile.
    pub fn trust(&self) {
        std::env::set_var("SSL_CERT_FILE", self.ca());
    }

    /// `redis-server` arguments that make it listen for TLS on `port` too,
    /// without asking clients for certificates.
    pub fn server_args(&self, port: u16) -> Vec<OsString> {
        server_args(&self.dir, port)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// [`TlsFiles::server_args`] for the files in `dir`.
pub(crate) fn server_args(dir: &Path, port: u16) -> Vec<OsString> {
    let path = |name: &str| dir.join(name).into_os_string();
    vec![
        "--tls-port".into(),
        port.to_string().into(),
        "--tls-cert-file".into(),
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

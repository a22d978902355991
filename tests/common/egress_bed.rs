//! The egress test bed: two network namespaces joined by a veth pair and nothing else.
//! `client` stands in for the host: the tests run `hatchery` there (so its broker lives
//! there too), with `/etc/resolv.conf` naming the bed. `internet` is the fake internet: the
//! servers of tests/support/egress_bed_server.py, on a public address, a private one and a
//! link-local one, each routed from the client into it. Neither namespace has any other
//! route, so whatever a broken egress path does (connect to a private address, resolve a
//! name upstream) lands in the bed, where the servers log it, and never leaves the machine.
//!
//! Each bed has namespaces of its own, so beds do not collide and tests run in parallel.
//! Dropping a bed (on panic too) kills its servers and removes both namespaces (the veth
//! pair and the routes go with them) and the resolver file; a bed whose test process is
//! gone (a killed run) is removed by the next bed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::{canonical, run_with_timeout, shared_tempdir};

/// The client's end of the veth pair.
pub const CLIENT_ADDR: &str = "198.51.100.1";
/// The bed's public address (TEST-NET-2: a documentation range no broker refuses).
pub const BED_ADDR: &str = "198.51.100.2";
/// A private (RFC 1918) address of the bed, routed from the client into it.
pub const PRIVATE_ADDR: &str = "10.255.0.1";
/// A link-local address of the bed, routed from the client into it.
pub const LINK_LOCAL_ADDR: &str = "169.254.7.7";

/// The python the servers and the payloads run (in a sandbox, /usr is the host's).
pub const PYTHON: &str = "/usr/bin/python3";

const SERVER: &str = include_str!("../support/egress_bed_server.py");
const PAYLOAD: &str = include_str!("../support/egress_payload.py");
const CLIENT_PREFIX: &str = "hbc-";
const INTERNET_PREFIX: &str = "hbi-";
/// Where `ip netns exec NAME` finds files to mount over /etc (here: resolv.conf).
const NETNS_ETC: &str = "/etc/netns";

static BEDS: AtomicUsize = AtomicUsize::new(0);

/// `CMD ARGS...` with a 30 s limit; panics with its output unless it succeeds.
fn must(args: &[&str]) -> Output {
    let out = quiet(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

/// `CMD ARGS...` with a 30 s limit, whatever its outcome.
fn quiet(args: &[&str]) -> Output {
    let (cmd, rest) = args.split_first().unwrap_or((&"true", &[]));
    run_with_timeout(Command::new(cmd).args(rest), Duration::from_secs(30))
}

fn write_readable(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("write {}: {e}", path.display());
    }
    let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644));
}

fn tempdir(prefix: &str) -> TempDir {
    match tempfile::Builder::new().prefix(prefix).tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

/// What sandboxes are given read-only (`--ro kit.path()`): the payload script and the
/// bed's CA certificate, readable by a sandbox's leased uid and by `nobody`.
pub struct Kit {
    dir: TempDir,
}

impl Kit {
    fn new() -> Kit {
        let kit = Kit {
            dir: shared_tempdir(),
        };
        write_readable(&kit.path().join("payload.py"), PAYLOAD);
        // Readable by any uid, writable by none but root.
        let _ = std::fs::set_permissions(
            kit.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
        kit
    }

    pub fn path(&self) -> PathBuf {
        canonical(self.dir.path())
    }

    pub fn path_str(&self) -> String {
        self.path().to_string_lossy().to_string()
    }

    /// The payload script (tests/support/egress_payload.py).
    pub fn payload(&self) -> String {
        self.path().join("payload.py").to_string_lossy().to_string()
    }

    /// The CA certificate the bed's HTTPS server chains to.
    pub fn ca(&self) -> String {
        self.path().join("ca.pem").to_string_lossy().to_string()
    }
}

/// A server started as `timeout 600 ip netns exec NS python3 SCRIPT MODE LOG ARGS...` in a
/// process group of its own, logging to a file; killed with its group when dropped.
pub struct Server {
    child: Child,
    log: PathBuf,
    /// The port it listens on when it picked a free one (0 for the bed's fixed ports).
    pub port: u16,
}

impl Server {
    fn start(ns: &str, dir: &Path, mode: &str, args: &[&str]) -> Server {
        let script = dir.join(format!("{mode}-server.py"));
        write_readable(&script, SERVER);
        let log = dir.join(format!("{mode}.log"));
        let errors = dir.join(format!("{mode}.err"));
        let stderr = File::create(&errors)
            .map(Stdio::from)
            .unwrap_or(Stdio::null());
        let mut cmd = Command::new("timeout");
        cmd.args(["600", "ip", "netns", "exec", ns, PYTHON])
            .arg(&script)
            .arg(mode)
            .arg(&log)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("start the test server {cmd:?}: {e}"),
        };
        let mut server = Server {
            child,
            log,
            port: 0,
        };
        let start = Instant::now();
        loop {
            if let Some(port) = server
                .log()
                .lines()
                .find_map(|l| l.strip_prefix("ready ")?.trim().parse().ok())
            {
                server.port = port;
                return server;
            }
            let exited = matches!(server.child.try_wait(), Ok(Some(_)));
            if exited || start.elapsed() > Duration::from_secs(15) {
                panic!(
                    "the {mode} server did not start: {}",
                    std::fs::read_to_string(&errors).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it logged so far (see tests/support/egress_bed_server.py).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's lines containing every one of `needles`.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    /// Waits until a log line contains `needle`; false after `limit`.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while self.log_lines(&[needle]).is_empty() {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The fake internet and the client namespace in front of it. See the module's comment.
pub struct Bed {
    /// The namespace standing in for the host (`hbc-<pid>-<n>`).
    pub client: String,
    /// The fake internet's namespace (`hbi-<pid>-<n>`).
    pub internet: String,
    pub kit: Kit,
    /// The servers on ports 80, 443, 9000, 9001, 9002 and UDP 53 of every bed address.
    servers: Option<Server>,
    /// The servers' key, certificate, scripts and logs (not given to sandboxes).
    dir: TempDir,
}

impl Bed {
    /// Removes beds of test processes that are gone, then builds a new bed with its
    /// servers running.
    pub fn new() -> Bed {
        remove_stale_beds();
        let n = BEDS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mut bed = Bed {
            client: format!("{CLIENT_PREFIX}{pid}-{n}"),
            internet: format!("{INTERNET_PREFIX}{pid}-{n}"),
            kit: Kit::new(),
            servers: None,
            dir: tempdir("hatchery-bed-"),
        };
        bed.wire();
        bed.make_certificates();
        let (cert, key) = (bed.file("server.pem"), bed.file("server.key"));
        bed.servers = Some(Server::start(
            &bed.internet,
            bed.dir.path(),
            "bed",
            &[&cert, &key],
        ));
        bed
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().to_string()
    }

    /// The namespaces, the veth pair, the addresses, the client's routes into the bed and
    /// its resolver (the bed's UDP port 53, which answers nothing and logs every query).
    fn wire(&self) {
        let (client, internet) = (self.client.as_str(), self.internet.as_str());
        for ns in [client, internet] {
            must(&["ip", "netns", "add", ns]);
            must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        must(&[
            "ip", "-n", client, "link", "add", "bed0", "type", "veth", "peer", "name", "eth0",
            "netns", internet,
        ]);
        must(&[
            "ip",
            "-n",
            client,
            "addr",
            "add",
            &format!("{CLIENT_ADDR}/30"),
            "dev",
            "bed0",
        ]);
        for addr in [
            format!("{BED_ADDR}/30"),
            format!("{PRIVATE_ADDR}/32"),
            format!("{LINK_LOCAL_ADDR}/32"),
        ] {
            must(&["ip", "-n", internet, "addr", "add", &addr, "dev", "eth0"]);
        }
        must(&["ip", "-n", client, "link", "set", "bed0", "up"]);
        must(&["ip", "-n", internet, "link", "set", "eth0", "up"]);
        for addr in [PRIVATE_ADDR, LINK_LOCAL_ADDR] {
            must(&[
                "ip",
                "-n",
                client,
                "route",
                "add",
                &format!("{addr}/32"),
                "dev",
                "bed0",
            ]);
        }
        // /etc/netns itself is removed by the last bed to go: a bed going away as this one
        // comes may take it between the two mkdirs, so try again.
        let etc = Path::new(NETNS_ETC).join(client);
        let mut made = std::fs::create_dir_all(&etc);
        for _ in 0..5 {
            if made.is_ok() {
                break;
            }
            made = std::fs::create_dir_all(&etc);
        }
        if let Err(e) = made {
            panic!("create {}: {e}", etc.display());
        }
        let resolver = format!("nameserver {BED_ADDR}");
        write_readable(&etc.join("resolv.conf"), &format!("{resolver}\n"));
        let seen = must(&["ip", "netns", "exec", client, "cat", "/etc/resolv.conf"]);
        assert_eq!(
            String::from_utf8_lossy(&seen.stdout).trim(),
            resolver,
            "`ip netns exec` did not give the client namespace the bed as its resolver \
             (is /etc/resolv.conf a dangling symlink?): lookups would leave the machine"
        );
    }

    /// A throw-away CA, and a certificate it signs for api.test and evil.test.
    fn make_certificates(&self) {
        let (ca_key, ca, key, csr, cert, ext) = (
            self.file("ca.key"),
            self.file("ca.pem"),
            self.file("server.key"),
            self.file("server.csr"),
            self.file("server.pem"),
            self.file("server.ext"),
        );
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut args = vec!["openssl", "req", "-x509"];
        args.extend(ec);
        args.extend(["-keyout", &ca_key, "-out", &ca, "-days", "2"]);
        args.extend(["-subj", "/CN=hatchery egress test CA"]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        must(&args);
        let mut args = vec!["openssl", "req"];
        args.extend(ec);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=api.test"]);
        must(&args);
        write_readable(
            Path::new(&ext),
            "subjectAltName=DNS:api.test,DNS:evil.test\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
             subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
        );
        must(&[
            "openssl",
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ]);
        let text = std::fs::read_to_string(&ca).unwrap_or_default();
        write_readable(&self.kit.path().join("ca.pem"), &text);
    }

    /// `PROGRAM` to be run in the client namespace (`ip netns exec CLIENT PROGRAM`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.client]).arg(program);
        cmd
    }

    /// The servers of the fake internet.
    pub fn servers(&self) -> &Server {
        match &self.servers {
            Some(s) => s,
            None => panic!("the bed has no servers"),
        }
    }

    /// An HTTP server on the client's loopback (127.0.0.1, a free port), answering as the
    /// bed's port 80 does: what a sandbox must not reach through a name, only through an
    /// allow entry naming the address. Dropped before the bed.
    pub fn loopback_server(&self) -> Server {
        Server::start(&self.client, self.dir.path(), "http", &[])
    }

    /// A server on the client's loopback (127.0.0.1, a free port) that reads one line
    /// "N" and sends N bytes, then closes. Dropped before the bed.
    pub fn stream_server(&self) -> Server {
        Server::start(&self.client, self.dir.path(), "stream", &[])
    }

    /// An HTTP server of the client itself on every address (0.0.0.0, a free port): a
    /// host service that its own non-loopback address ([`CLIENT_ADDR`]) reaches as well
    /// as loopback does. Dropped before the bed.
    pub fn host_server(&self) -> Server {
        Server::start(&self.client, self.dir.path(), "host-http", &[])
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        drop(self.servers.take());
        remove_bed(&self.client, &self.internet);
    }
}

/// Kills what still runs in the two namespaces, then removes them (the veth pair and the
/// routes go with them) and the client's resolver file.
fn remove_bed(client: &str, internet: &str) {
    for ns in [client, internet] {
        let pids = quiet(&["ip", "netns", "pids", ns]);
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        quiet(&["ip", "netns", "del", ns]);
    }
    let _ = std::fs::remove_dir_all(Path::new(NETNS_ETC).join(client));
    // Only when empty: other beds, or other users of `ip netns`, may have files there.
    let _ = std::fs::remove_dir(NETNS_ETC);
}

/// Beds named after a test process that no longer exists (`hbc-<pid>-<n>`, `hbi-<pid>-<n>`).
fn remove_stale_beds() {
    let list = quiet(&["ip", "netns", "list"]);
    let names = String::from_utf8_lossy(&list.stdout).to_string();
    for suffix in names
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|n| {
            n.strip_prefix(CLIENT_PREFIX)
                .or_else(|| n.strip_prefix(INTERNET_PREFIX))
        })
    {
        let pid = suffix.split('-').next().unwrap_or_default();
        if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
            remove_bed(
                &format!("{CLIENT_PREFIX}{suffix}"),
                &format!("{INTERNET_PREFIX}{suffix}"),
            );
        }
    }
}

/// One finished `hatchery run` in a bed: what it printed, and its report.
pub struct Run {
    pub out: Output,
    pub report: serde_json::Value,
}

impl Run {
    /// The payload's line for step `i`; panics with hatchery's stderr when there is none.
    pub fn line(&self, i: usize) -> String {
        let out = super::stdout(&self.out);
        match out.lines().nth(i) {
            Some(l) => l.to_string(),
            None => panic!(
                "no line {i} from the payload (exit {}): stdout {out:?}, stderr {}",
                super::code(&self.out),
                super::stderr(&self.out)
            ),
        }
    }

    /// The report's `egress` entries.
    pub fn egress(&self) -> Vec<serde_json::Value> {
        self.report["egress"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// Owned strings for a command line.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

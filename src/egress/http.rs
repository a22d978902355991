//! What the HTTP proxy and the transparent port-80 listener read from a sandbox: the
//! destination of a request, checked before a byte of it goes anywhere.
//!
//! Request heads are parsed by `httparse`. The destination (`host[:port]`, from a CONNECT
//! target, an absolute URI or a Host header) is read strictly: a host name of RFC 1123
//! labels, a dotted-quad IPv4 address or a bracketed IPv6 address, nothing else. Percent
//! escapes, user info, non-ASCII and the numeric shorthands some parsers read as IPv4
//! (`127.1`, `0x7f000001`) are refused, so the name the policy checks is the name
//! connected to.

use std::net::{IpAddr, Ipv6Addr};

use super::EgressError;
use super::allow::{canonical_name, parse_port};

/// Largest request head read; a client needing more is refused.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in one head.
const MAX_HEADERS: usize = 100;
/// Longest text put in a denial header.
const MAX_REASON: usize = 200;

/// A proxy request: where it goes and what to send there. `host` is a lowercase name
/// without trailing dot, or an address in plain text (IPv6 without brackets, IPv4-mapped
/// as IPv4); [`Destination::from_host`](super::Destination::from_host) tells which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// `CONNECT host:port`: a tunnel; the bytes after the head's `consumed` belong to the
    /// tunnel.
    Connect {
        host: String,
        port: u16,
        consumed: usize,
    },
    /// A plain-HTTP request through the proxy: `head` is the request rewritten for the
    /// origin server (origin-form target, `Connection: close`, no proxy headers);
    /// `consumed` is the length of the head as received, after which the body follows
    /// unchanged.
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
        consumed: usize,
    },
}

fn malformed(why: impl Into<String>) -> EgressError {
    EgressError::HttpMalformed(why.into())
}

fn refused(why: impl Into<String>) -> EgressError {
    EgressError::HttpRefused(why.into())
}

/// Parses the request head at the start of `buf` into `req`: `Ok(None)` while it is
/// incomplete, the head's length once complete.
fn parse_head<'h, 'b>(
    buf: &'b [u8],
    req: &mut httparse::Request<'h, 'b>,
) -> Result<Option<usize>, EgressError> {
    let window = buf.get(..MAX_HEAD).unwrap_or(buf);
    match req.parse(window) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            Err(EgressError::HeadTooLarge { limit: MAX_HEAD })
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            Err(malformed(format!("more than {MAX_HEADERS} header fields")))
        }
        Err(e) => Err(malformed(e.to_string())),
    }
}

/// The request a sandbox sent to the HTTP proxy, once its head has arrived (`Ok(None)`
/// until then; a head over [`MAX_HEAD`] is an error).
///
/// `CONNECT host:port` opens a tunnel. Any other method needs an absolute `http://` URI;
/// the request is rewritten to origin form for the server, keeps its headers except
/// `Proxy-Connection`, `Proxy-Authorization`, `Connection` and `Upgrade`, and gets
/// `Connection: close`, so one proxied connection carries one request to the one host that
/// was checked. A Host header naming another host is refused; a missing one is added.
pub fn proxy_request(buf: &[u8]) -> Result<Option<ProxyRequest>, EgressError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let Some(consumed) = parse_head(buf, &mut req)? else {
        return Ok(None);
    };
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = authority(target, None)?;
        return Ok(Some(ProxyRequest::Connect {
            host,
            port,
            consumed,
        }));
    }
    let (host, port, origin) = absolute_http_uri(target)?;
    let mut host_seen = false;
    let version = req.version.unwrap_or(1);
    let mut head = format!("{method} {origin} HTTP/1.{version}\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("proxy-connection")
            || name.eq_ignore_ascii_case("proxy-authorization")
            || name.eq_ignore_ascii_case("connection")
            || name.eq_ignore_ascii_case("upgrade")
        {
            continue;
        }
        if name.eq_ignore_ascii_case("host") {
            if host_seen {
                return Err(malformed("more than one Host header"));
            }
            host_seen = true;
            let (named, named_port) = host_header(h.value)?;
            if named != host {
                return Err(refused(format!(
                    "the Host header names {named} but the URI names {host}"
                )));
            }
            same_port(named_port, port)?;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    if !host_seen {
        head.extend_from_slice(format!("Host: {}\r\n", host_text(&host, port, 80)).as_bytes());
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(ProxyRequest::Forward {
        host,
        port,
        head,
        consumed,
    }))
}

/// The host (without port) of the first request on a connection to `port` checked by its
/// Host (the transparent port-80 listener, a CONNECT to port 80), from its Host header,
/// once the head has arrived (`Ok(None)` until then). No Host header, two of them, a Host
/// naming another port, or an absolute URI naming another host or port is an error.
pub fn first_request_host(buf: &[u8], port: u16) -> Result<Option<String>, EgressError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if parse_head(buf, &mut req)?.is_none() {
        return Ok(None);
    }
    let mut hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let (host, host_port) = match (hosts.next(), hosts.next()) {
        (Some(h), None) => host_header(h.value)?,
        (None, _) => return Err(malformed("no Host header")),
        (Some(_), Some(_)) => return Err(malformed("more than one Host header")),
    };
    same_port(host_port, port)?;
    let target = req.path.unwrap_or_default();
    if !target.starts_with('/') && target != "*" {
        // An absolute URI wins over Host at the server (RFC 9112, 3.2.2): it must agree.
        let (named, named_port, _) = absolute_http_uri(target)?;
        if named != host || named_port != port {
            return Err(refused(format!(
                "the Host header names {host} but the URI names {named}:{named_port}"
            )));
        }
    }
    Ok(Some(host))
}

/// The bytes to send for a connection checked by the Host of its first request (the
/// transparent port-80 listener, a CONNECT to port 80): that request made the only one.
/// Its head is rewritten with `Connection: close` in place of any `Connection` and
/// `Upgrade` header, so the server closes after answering it and never switches protocol
/// (h2c), as the proxy's absolute-URI requests are; what followed the head is kept as it
/// came. Call once [`first_request_host`] has accepted `buf`.
pub fn close_after_first(buf: &[u8]) -> Result<Vec<u8>, EgressError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let consumed =
        parse_head(buf, &mut req)?.ok_or_else(|| malformed("the request head is incomplete"))?;
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let version = req.version.unwrap_or(1);
    let mut out = format!("{method} {target} HTTP/1.{version}\r\n").into_bytes();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") || h.name.eq_ignore_ascii_case("upgrade") {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(buf.get(consumed..).unwrap_or_default());
    Ok(out)
}

/// Refuses a Host whose port (80 when it names none) is not `port`, the one checked and
/// connected to: a server, or the front of several, may route by the Host's port too, and
/// another could reach a service on a port never allowed.
fn same_port(named: Option<u16>, port: u16) -> Result<(), EgressError> {
    let named = named.unwrap_or(80);
    if named == port {
        Ok(())
    } else {
        Err(refused(format!(
            "the Host header names port {named} but the connection is to port {port}"
        )))
    }
}

/// A Host header's host and port (`None` when absent). The header is passed on as the
/// client wrote it, so it must be written the one way it was checked: a port with a
/// leading zero (`:080`) or a name with a trailing dot (`web.test.`) reads as the same
/// destination here, but a server routing by the Host's text may take it for another.
fn host_header(value: &[u8]) -> Result<(String, Option<u16>), EgressError> {
    let text = std::str::from_utf8(value)
        .map_err(|_| malformed("the Host header is not ASCII"))?
        .trim();
    let (host, port) = split_authority(text)?;
    // With a port, it follows the last ':' (an address's own colons are in brackets).
    let (name_text, port_text) = match (port, text.rsplit_once(':')) {
        (Some(_), Some((name, port))) => (name, port),
        _ => (text, ""),
    };
    if port_text.len() > 1 && port_text.starts_with('0') {
        return Err(refused(format!(
            "the Host header {text:?} writes its port with a leading zero; write it plainly"
        )));
    }
    if name_text.ends_with('.') {
        return Err(refused(format!(
            "the Host header {text:?} ends its name with a dot; write the name without it"
        )));
    }
    Ok((host, port))
}

/// `host:port` as in a CONNECT target, or with `default` as the port when none is given.
fn authority(text: &str, default: Option<u16>) -> Result<(String, u16), EgressError> {
    let (host, port) = split_authority(text)?;
    match port.or(default) {
        Some(port) => Ok((host, port)),
        None => Err(malformed(format!(
            "{text:?} has no port; write it like example.com:443"
        ))),
    }
}

/// Splits `host[:port]`: the host canonical (a lowercase name, or an address without
/// brackets), the port if one is given.
fn split_authority(text: &str) -> Result<(String, Option<u16>), EgressError> {
    if text.contains('@') {
        return Err(refused("user info in the authority is not carried"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| malformed(format!("{text:?}: '[' without ']'")))?;
        let addr: Ipv6Addr = inside
            .parse()
            .map_err(|_| malformed(format!("{inside:?} is not an IPv6 address")))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| malformed(format!("{text:?}: expected ':' after ']'")))?,
            ),
        };
        (IpAddr::V6(addr).to_canonical().to_string(), port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        let host = match host.parse::<std::net::Ipv4Addr>() {
            Ok(v4) => v4.to_string(),
            Err(_) => {
                canonical_name(host).map_err(|why| malformed(format!("host {host:?}: {why}")))?
            }
        };
        (host, port)
    };
    let port = port.map(|p| parse_port(p).map_err(malformed)).transpose()?;
    Ok((host, port))
}

/// An absolute `http://` URI's host, port (80 when absent) and origin-form target (path
/// and query, `/` when empty).
fn absolute_http_uri(target: &str) -> Result<(String, u16, String), EgressError> {
    let (scheme, rest) = target.split_once("://").ok_or_else(|| {
        refused("not a proxy request: the target must be an absolute http:// URI")
    })?;
    if scheme.eq_ignore_ascii_case("https") {
        return Err(refused(
            "https:// through the proxy is not carried; use CONNECT host:443",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(refused(format!(
            "scheme {scheme:?} is not carried; only http://"
        )));
    }
    if rest.contains(['\\', '#']) {
        return Err(malformed("'\\' or '#' in the request target"));
    }
    // The authority ends at the first '/' or '?' (RFC 3986, 3.2).
    let (auth, path) = rest
        .find(['/', '?'])
        .and_then(|at| rest.split_at_checked(at))
        .unwrap_or((rest, ""));
    let (host, port) = authority(auth, Some(80))?;
    let origin = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok((host, port, origin))
}

/// `host[:port]` as written in a Host header (IPv6 in brackets; the port left out when it
/// is the default).
fn host_text(host: &str, port: u16, default: u16) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    if port == default {
        host
    } else {
        format!("{host}:{port}")
    }
}

/// A minimal response with no body that closes the connection; `reason`, when not empty,
/// goes in an `X-Hatchery-Denied` header (printable ASCII only, at most 200 bytes).
pub fn status(code: u16, reason: &str) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {code} {}\r\n", phrase(code));
    let reason: String = reason
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(MAX_REASON)
        .collect();
    let reason = reason.trim();
    if !reason.is_empty() {
        out.push_str(&format!("X-Hatchery-Denied: {reason}\r\n"));
    }
    out.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
    out.into_bytes()
}

/// The reply to a CONNECT that was allowed and connected: after it, the tunnel.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

fn phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn forward(req: &str) -> (String, u16, String, usize) {
        match proxy_request(req.as_bytes()).unwrap().unwrap() {
            ProxyRequest::Forward {
                host,
                port,
                head,
                consumed,
            } => (host, port, String::from_utf8(head).unwrap(), consumed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connect_gives_the_tunnel_host_and_port() {
        for (target, host, port) in [
            ("api.example.com:443", "api.example.com", 443),
            ("API.Example.com.:8443", "api.example.com", 8443),
            ("198.51.100.7:443", "198.51.100.7", 443),
            ("[2001:db8::1]:443", "2001:db8::1", 443),
            ("[::ffff:198.51.100.7]:443", "198.51.100.7", 443),
        ] {
            let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
            let mut with_early = req.clone().into_bytes();
            with_early.extend_from_slice(b"\x16\x03\x01");
            assert_eq!(
                proxy_request(&with_early).unwrap(),
                Some(ProxyRequest::Connect {
                    host: host.into(),
                    port,
                    consumed: req.len(),
                }),
                "{target}"
            );
        }
    }

    #[test]
    fn connect_without_a_port_or_to_a_disguised_address_is_refused() {
        for target in [
            "api.example.com",
            "api.example.com:0",
            "api.example.com:65536",
            "api.example.com:+443",
            "127.1:443",
            "0x7f000001:443",
            "2130706433:443",
            "user@api.example.com:443",
            "api%2eexample.com:443",
            "2001:db8::1:443",
            "[2001:db8::1]443",
            "exämple.com:443",
        ] {
            let req = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
            assert!(proxy_request(req.as_bytes()).is_err(), "{target}");
        }
    }

    #[test]
    fn an_absolute_uri_is_rewritten_to_origin_form_with_connection_close() {
        let req = "GET http://api.example.com/v1/x?q=1 HTTP/1.1\r\n\
                   Host: api.example.com\r\n\
                   Proxy-Connection: keep-alive\r\n\
                   Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
                   Connection: keep-alive\r\n\
                   Accept: */*\r\n\r\nBODY";
        let (host, port, head, consumed) = forward(req);
        assert_eq!(host, "api.example.com");
        assert_eq!(port, 80);
        assert_eq!(
            head,
            "GET /v1/x?q=1 HTTP/1.1\r\nHost: api.example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(&req.as_bytes()[consumed..], b"BODY");
    }

    #[test]
    fn a_missing_host_header_is_added_from_the_uri() {
        let (host, port, head, _) =
            forward("POST http://[2001:db8::1]:8080 HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
        assert_eq!((host.as_str(), port), ("2001:db8::1", 8080));
        assert_eq!(
            head,
            "POST / HTTP/1.0\r\nContent-Length: 0\r\nHost: [2001:db8::1]:8080\r\nConnection: close\r\n\r\n"
        );
        let (_, _, head, _) = forward("GET http://a.example.com?x HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("GET /?x HTTP/1.1\r\nHost: a.example.com\r\n"),
            "{head}"
        );
    }

    #[test]
    fn a_host_header_naming_another_host_is_refused() {
        let req = "GET http://api.example.com/ HTTP/1.1\r\nHost: evil.example.com\r\n\r\n";
        assert!(matches!(
            proxy_request(req.as_bytes()),
            Err(EgressError::HttpRefused(_))
        ));
        // The same host in another case, with a port, is the same host.
        let req = "GET http://api.example.com/ HTTP/1.1\r\nHost: API.example.com:80\r\n\r\n";
        assert!(proxy_request(req.as_bytes()).is_ok());
        let req = "GET http://api.example.com:8081/ HTTP/1.1\r\nHost: api.example.com:8081\r\n\r\n";
        assert!(proxy_request(req.as_bytes()).is_ok());
        // Another port than the one checked, or the default one for another: refused.
        for req in [
            "GET http://api.example.com:8081/x HTTP/1.1\r\nHost: api.example.com:8082\r\n\r\n",
            "GET http://api.example.com:8081/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            "GET http://api.example.com/x HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n",
        ] {
            assert!(
                matches!(
                    proxy_request(req.as_bytes()),
                    Err(EgressError::HttpRefused(_))
                ),
                "{req}"
            );
        }
        // Whatever a payload writes for the port: a number past 65535, a sign, a space, a
        // letter, nothing after the colon, a second colon. Refused, never read as 80.
        for port in [":65616", ":-80", ": 80", ":80a", ":", ":80:81", ":+80"] {
            let req = format!(
                "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com{port}\r\n\r\n"
            );
            assert!(proxy_request(req.as_bytes()).is_err(), "{req}");
            let req = format!("GET / HTTP/1.1\r\nHost: api.example.com{port}\r\n\r\n");
            assert!(first_request_host(req.as_bytes(), 80).is_err(), "{req}");
        }
        // Spellings that read as the allowed port or name here but are passed on as
        // written, for a server that may read them otherwise.
        for host in [
            "api.example.com:080",
            "api.example.com.",
            "api.example.com.:80",
        ] {
            let req = format!("GET http://api.example.com/ HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert!(proxy_request(req.as_bytes()).is_err(), "{req}");
            let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert!(first_request_host(req.as_bytes(), 80).is_err(), "{req}");
        }
        for host in [
            "api.example.com:80",
            "API.example.com",
            "[2001:db8::1]:80",
            "[2001:db8::1]",
        ] {
            let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert!(first_request_host(req.as_bytes(), 80).is_ok(), "{req}");
        }
        let req = "GET http://a.example.com/ HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\n\r\n";
        assert!(proxy_request(req.as_bytes()).is_err());
    }

    #[test]
    fn https_and_origin_form_requests_to_the_proxy_are_refused() {
        let err = proxy_request(b"GET https://api.example.com/ HTTP/1.1\r\n\r\n").unwrap_err();
        assert!(err.to_string().contains("CONNECT"), "{err}");
        for req in [
            "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            "GET ftp://api.example.com/ HTTP/1.1\r\n\r\n",
            "GET http://user:pw@api.example.com/ HTTP/1.1\r\n\r\n",
            "GET http:///x HTTP/1.1\r\n\r\n",
            "GET http://api.example.com\\@evil.example.com/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(proxy_request(req.as_bytes()).is_err(), "{req}");
        }
    }

    #[test]
    fn an_incomplete_head_waits_and_an_oversized_one_is_refused() {
        assert_eq!(proxy_request(b"").unwrap(), None);
        assert_eq!(
            proxy_request(b"CONNECT api.example.com:443 HTTP/1.1\r\n").unwrap(),
            None
        );
        let mut big = b"GET http://a.example.com/ HTTP/1.1\r\n".to_vec();
        while big.len() < MAX_HEAD {
            big.extend_from_slice(format!("X-Filler: {}\r\n", "a".repeat(300)).as_bytes());
        }
        assert_eq!(
            proxy_request(&big),
            Err(EgressError::HeadTooLarge { limit: MAX_HEAD })
        );
        assert_eq!(
            first_request_host(&big, 80),
            Err(EgressError::HeadTooLarge { limit: MAX_HEAD })
        );
        assert!(proxy_request(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03").is_err());
    }

    #[test]
    fn the_transparent_listener_reads_the_host_header_without_its_port() {
        for (req, host) in [
            (
                "GET / HTTP/1.1\r\nHost: API.example.com:80\r\n\r\n",
                "api.example.com",
            ),
            (
                "GET /x HTTP/1.1\r\nhost: 198.51.100.7\r\n\r\n",
                "198.51.100.7",
            ),
            (
                "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n",
                "2001:db8::1",
            ),
            (
                "GET http://a.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
                "a.example.com",
            ),
        ] {
            assert_eq!(
                first_request_host(req.as_bytes(), 80).unwrap().as_deref(),
                Some(host),
                "{req}"
            );
        }
        assert_eq!(
            first_request_host(b"GET / HTTP/1.1\r\nHost: a.example.com\r\n", 80).unwrap(),
            None
        );
        for req in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\n\r\n",
            "GET http://b.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n",
            // Another port than the connection's.
            "GET / HTTP/1.1\r\nHost: a.example.com:8080\r\n\r\n",
            "GET http://a.example.com:8080/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        ] {
            assert!(first_request_host(req.as_bytes(), 80).is_err(), "{req}");
        }
    }

    #[test]
    fn the_first_request_of_a_checked_connection_is_made_its_last() {
        let req = "GET /x HTTP/1.1\r\nHost: a.example.com\r\nConnection: keep-alive, Upgrade\r\n\
                   Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n\
                   GET / HTTP/1.1\r\nHost: b.example.com\r\n\r\n";
        let out = String::from_utf8(close_after_first(req.as_bytes()).unwrap()).unwrap();
        assert_eq!(
            out,
            "GET /x HTTP/1.1\r\nHost: a.example.com\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\
             Connection: close\r\n\r\nGET / HTTP/1.1\r\nHost: b.example.com\r\n\r\n"
        );
        assert!(close_after_first(b"GET / HTTP/1.1\r\nHost: a.example.com\r\n").is_err());
    }

    #[test]
    fn a_denial_is_a_closed_empty_response_with_a_printable_reason() {
        assert_eq!(
            String::from_utf8(status(403, "not_allowed: evil.example.com:443")).unwrap(),
            "HTTP/1.1 403 Forbidden\r\nX-Hatchery-Denied: not_allowed: evil.example.com:443\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let text = String::from_utf8(status(
            400,
            &format!("a\r\nSet-Cookie: x\u{e9}{}", "z".repeat(500)),
        ))
        .unwrap();
        let line = text.lines().nth(1).unwrap();
        assert!(
            line.starts_with("X-Hatchery-Denied: a??Set-Cookie: x?zz"),
            "{line}"
        );
        assert!(line.len() <= "X-Hatchery-Denied: ".len() + 200);
        assert_eq!(text.matches("\r\n").count(), 5);
        assert_eq!(
            status(502, ""),
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn arbitrary_bytes_never_panic_the_http_parsers(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = proxy_request(&bytes);
            let _ = first_request_host(&bytes, 80);
        }

        #[test]
        fn arbitrary_targets_never_panic_the_http_parsers(
            method in "(GET|CONNECT|POST)",
            target in "[ -~]{0,60}",
            host in "[ -~]{0,40}",
        ) {
            let req = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n");
            if let Ok(Some(ProxyRequest::Forward { head, .. })) = proxy_request(req.as_bytes()) {
                // What goes to the server is itself one well-formed head.
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut again = httparse::Request::new(&mut headers);
                prop_assert_eq!(again.parse(&head), Ok(httparse::Status::Complete(head.len())));
            }
            let _ = first_request_host(req.as_bytes(), 80);
        }
    }
}

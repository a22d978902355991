//! The server name a TLS client asks for, read from its ClientHello before anything is
//! relayed, so a connection to an allowed address cannot be used to reach another name
//! served there (and the broker can decide by name on a transparent port).
//!
//! Records and messages are parsed by `tls-parser`. Extensions are walked as opaque
//! (type, data) pairs and only server_name is interpreted, so an extension this parser
//! reads differently from the client's library never refuses a good ClientHello.

use tls_parser::{
    SNIType, TlsExtension, TlsMessage, TlsMessageHandshake, TlsRecordType,
    parse_tls_extension_sni_content, parse_tls_extension_unknown, parse_tls_message_handshake,
    parse_tls_raw_record, parse_tls_record_header,
};

use super::EgressError;
use super::allow::canonical_name;

/// Largest TLS plaintext record body (RFC 8446, 5.1): 16 KiB.
pub const MAX_RECORD: usize = 1 << 14;
/// The server_name extension's type.
const SERVER_NAME: u16 = 0;

/// What the first bytes of a TLS connection say about the server asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// The host name asked for, lowercased, without a trailing dot.
    Sni(String),
    /// A ClientHello without a host name.
    NoSni,
    /// The first record has not fully arrived: read more.
    Incomplete,
}

fn tls(why: &str) -> EgressError {
    EgressError::Tls(why.to_string())
}

/// Reads the ClientHello at the start of `buf`.
///
/// The ClientHello must come whole in the first record: one split across records (legal,
/// but not what clients send unless it exceeds 16 KiB) is refused rather than reassembled,
/// which keeps the buffering bounded by one record. Anything that is not a handshake
/// record starting with a ClientHello, or a record body over 16 KiB, is an error.
pub fn client_hello(buf: &[u8]) -> Result<ClientHello, EgressError> {
    let header = match parse_tls_record_header(buf) {
        Ok((_, header)) => header,
        Err(tls_parser::Err::Incomplete(_)) => return Ok(ClientHello::Incomplete),
        Err(_) => return Err(tls("no TLS record header")),
    };
    if header.record_type != TlsRecordType::Handshake {
        return Err(tls("the first record is not a handshake record"));
    }
    if header.version.0 & 0xff00 != 0x0300 {
        return Err(tls("the record's protocol version is not TLS"));
    }
    if usize::from(header.len) > MAX_RECORD {
        return Err(tls("the first record is larger than 16 KiB"));
    }
    let record = match parse_tls_raw_record(buf) {
        Ok((_, record)) => record,
        Err(tls_parser::Err::Incomplete(_)) => return Ok(ClientHello::Incomplete),
        Err(_) => return Err(tls("unreadable TLS record")),
    };
    let hello = match parse_tls_message_handshake(record.data) {
        Ok((_, TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)))) => hello,
        Ok(_) => return Err(tls("the first handshake message is not a ClientHello")),
        Err(tls_parser::Err::Incomplete(_)) => {
            return Err(tls(
                "the ClientHello does not fit in the first record (split across records or truncated)",
            ));
        }
        Err(_) => return Err(tls("malformed ClientHello")),
    };
    let Some(mut extensions) = hello.ext else {
        return Ok(ClientHello::NoSni);
    };
    let mut found: Option<String> = None;
    let mut seen = false;
    while !extensions.is_empty() {
        let (rest, extension) = parse_tls_extension_unknown(extensions)
            .map_err(|_| tls("malformed ClientHello extensions"))?;
        extensions = rest;
        let TlsExtension::Unknown(kind, data) = extension else {
            continue;
        };
        if kind.0 != SERVER_NAME {
            continue;
        }
        if seen {
            return Err(tls("two server_name extensions"));
        }
        seen = true;
        found = server_name(data)?;
    }
    Ok(found.map_or(ClientHello::NoSni, ClientHello::Sni))
}

/// The host name in a server_name extension's data, if it has one.
fn server_name(data: &[u8]) -> Result<Option<String>, EgressError> {
    let Ok((_, TlsExtension::SNI(names))) = parse_tls_extension_sni_content(data) else {
        return Err(tls("malformed server_name extension"));
    };
    let mut hosts = names.iter().filter(|(kind, _)| *kind == SNIType::HostName);
    let host = match (hosts.next(), hosts.next()) {
        (None, _) => return Ok(None),
        (Some(_), Some(_)) => return Err(tls("two host names in server_name")),
        (Some((_, host)), None) => host,
    };
    let text = std::str::from_utf8(host).map_err(|_| tls("the server name is not ASCII"))?;
    // The hello is passed on as the client wrote it, so the name must be written the one
    // way it was checked, as the Host header must: `api.test.` reads as `api.test` here,
    // but a server routing by the name's text may take it for another (RFC 6066 writes it
    // without the dot).
    if text.ends_with('.') {
        return Err(EgressError::Tls(format!(
            "server name {text:?} ends with a dot; a client writes it without one"
        )));
    }
    canonical_name(text)
        .map(Some)
        .map_err(|why| EgressError::Tls(format!("server name {text:?}: {why}")))
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

    fn u16be(n: usize) -> [u8; 2] {
        u16::try_from(n).unwrap().to_be_bytes()
    }

    fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend(u16be(data.len()));
        e.extend(data);
        e
    }

    fn sni_ext(names: &[&[u8]]) -> Vec<u8> {
        let mut list = Vec::new();
        for n in names {
            list.push(0u8);
            list.extend(u16be(n.len()));
            list.extend(*n);
        }
        let mut data = u16be(list.len()).to_vec();
        data.extend(list);
        ext(0, &data)
    }

    /// A TLS 1.3-style ClientHello record with these extensions.
    fn hello_with(extensions: Option<Vec<u8>>) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]); // random
        body.push(32);
        body.extend([9u8; 32]); // session id
        body.extend([0, 4, 0x13, 0x01, 0x13, 0x02]); // two cipher suites
        body.extend([1, 0]); // null compression
        if let Some(exts) = extensions {
            body.extend(u16be(exts.len()));
            body.extend(exts);
        }
        let mut handshake = vec![1, 0];
        handshake.extend(u16be(body.len()));
        handshake.extend(body);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend(u16be(handshake.len()));
        record.extend(handshake);
        record
    }

    fn hello(sni: &[u8]) -> Vec<u8> {
        let mut exts = ext(0x002b, &[2, 0x03, 0x04]); // supported_versions
        exts.extend(sni_ext(&[sni]));
        exts.extend(ext(0x0033, &[0xde, 0xad])); // a key_share tls-parser would not read
        hello_with(Some(exts))
    }

    #[test]
    fn the_server_name_is_read_lowercased_and_refused_with_a_dot() {
        assert_eq!(
            client_hello(&hello(b"API.Example.com")).unwrap(),
            ClientHello::Sni("api.example.com".into())
        );
        // Relayed as written, checked as read: one spelling only.
        assert!(client_hello(&hello(b"api.example.com.")).is_err());
        // Application data after the record does not matter.
        let mut more = hello(b"files.pypi.org");
        more.extend([0x17, 3, 3, 0, 1, 0]);
        assert_eq!(
            client_hello(&more).unwrap(),
            ClientHello::Sni("files.pypi.org".into())
        );
    }

    #[test]
    fn a_hello_without_a_server_name_says_so() {
        assert_eq!(client_hello(&hello_with(None)).unwrap(), ClientHello::NoSni);
        let exts = ext(0x002b, &[2, 0x03, 0x04]);
        assert_eq!(
            client_hello(&hello_with(Some(exts))).unwrap(),
            ClientHello::NoSni
        );
        assert_eq!(
            client_hello(&hello_with(Some(sni_ext(&[])))).unwrap(),
            ClientHello::NoSni
        );
    }

    #[test]
    fn every_prefix_of_a_hello_is_incomplete() {
        let whole = hello(b"api.example.com");
        for len in 0..whole.len() {
            assert_eq!(
                client_hello(&whole[..len]).unwrap(),
                ClientHello::Incomplete,
                "{len}"
            );
        }
    }

    #[test]
    fn what_is_not_a_client_hello_is_an_error() {
        let mut app_data = hello(b"api.example.com");
        app_data[0] = 0x17;
        let mut server_hello = hello(b"api.example.com");
        server_hello[5] = 2;
        let mut ssl2 = hello(b"api.example.com");
        ssl2[1] = 2;
        for bytes in [
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n".to_vec(),
            b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
            app_data,
            server_hello,
            ssl2,
        ] {
            assert!(client_hello(&bytes).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn an_oversized_record_is_refused_before_it_arrives() {
        let header = [0x16, 0x03, 0x01, 0x40, 0x01];
        assert!(client_hello(&header).is_err());
        let at_limit = [0x16, 0x03, 0x01, 0x40, 0x00];
        assert_eq!(client_hello(&at_limit).unwrap(), ClientHello::Incomplete);
    }

    #[test]
    fn a_hello_split_across_records_is_refused() {
        let whole = hello(b"api.example.com");
        // The same handshake message cut in two records.
        let handshake = &whole[5..];
        let (a, b) = handshake.split_at(20);
        let mut split = vec![0x16, 0x03, 0x01];
        split.extend(u16be(a.len()));
        split.extend(a);
        split.extend([0x16, 0x03, 0x01]);
        split.extend(u16be(b.len()));
        split.extend(b);
        assert!(client_hello(&split).is_err());
    }

    #[test]
    fn a_doubtful_server_name_is_an_error() {
        for name in [
            &b"evil com"[..],
            b"api.example.com\0.evil.com",
            b"198.51.100.7",
            b"",
            b"exa\xc3\xa4mple.com",
        ] {
            assert!(client_hello(&hello(name)).is_err(), "{name:?}");
        }
        let mut two = sni_ext(&[b"a.example.com"]);
        two.extend(sni_ext(&[b"b.example.com"]));
        assert!(client_hello(&hello_with(Some(two))).is_err());
        let both = sni_ext(&[b"a.example.com", b"b.example.com"]);
        assert!(client_hello(&hello_with(Some(both))).is_err());
        let mut cut = ext(0x002b, &[2, 0x03, 0x04]);
        cut.extend([0, 0, 0, 9, 0]);
        assert!(client_hello(&hello_with(Some(cut))).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn arbitrary_bytes_never_panic_the_hello_reader(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = client_hello(&bytes);
            let mut framed = vec![0x16, 0x03, 0x01];
            framed.extend(u16be(bytes.len()));
            framed.extend(&bytes);
            let _ = client_hello(&framed);
        }

        #[test]
        fn a_mutated_hello_never_panics_the_reader(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let mut h = hello(b"api.example.com");
            for (at, byte) in flips {
                let i = at.index(h.len());
                h[i] = byte;
            }
            let _ = client_hello(&h);
        }
    }
}

//! The DNS stub's answers. Allowed names get an address from the sandbox's [`FakePool`];
//! nothing is ever looked up for real, so a query cannot carry data out of the sandbox and
//! the answer reveals nothing of the network outside.

use std::net::Ipv4Addr;

use hickory_proto::op::{Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use super::allow::{AllowList, canonical_name, is_label};
use super::pool::FakePool;

/// Seconds a client may cache an answer: short, so a stale pool address never outlives a
/// sandbox by much, and a changed allowlist is seen soon.
pub const TTL: u32 = 5;
/// Largest reply: what plain UDP DNS carries without EDNS.
pub const MAX_REPLY: usize = 512;

/// What a query asked and how it was answered, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DnsOutcome {
    /// The question's name, lowercased without the trailing dot; `None` when the query had
    /// no readable question.
    pub name: Option<String>,
    /// The question's type (`A`, `AAAA`, `TYPE65` for types without a name); empty when
    /// there was no question.
    pub qtype: String,
    /// The pool address answered, if any.
    pub answered: Option<Ipv4Addr>,
    /// True when the reply was REFUSED: a name not allowed, or a question this stub does
    /// not answer.
    pub refused: bool,
}

/// The reply to one DNS message (without a TCP length prefix), or `None` when none should
/// be sent, and what happened.
///
/// A standard query with one IN question: `A` for a name the allowlist knows is answered
/// with the name's pool address; `AAAA` for such a name gets an empty NOERROR (so
/// dual-stack clients fall back to `A`); anything else is REFUSED. A full pool is SERVFAIL,
/// a message whose header reads but whose body does not is FORMERR, and no reply is sent
/// to bytes without a header or to a message that is itself a response (answering
/// responses lets two resolvers bounce packets between them forever).
pub fn answer(
    query: &[u8],
    allow: &AllowList,
    pool: &mut FakePool,
) -> (Option<Vec<u8>>, DnsOutcome) {
    let mut outcome = DnsOutcome::default();
    let Ok(header) = Header::read(&mut BinDecoder::new(query)) else {
        return (None, outcome);
    };
    if header.metadata.message_type == MessageType::Response {
        return (None, outcome);
    }
    let request = header.metadata;
    let Ok(message) = Message::from_vec(query) else {
        return (
            encode(reply(&request, ResponseCode::FormErr, None, None)),
            outcome,
        );
    };
    let [question] = message.queries.as_slice() else {
        return (
            encode(reply(&request, ResponseCode::FormErr, None, None)),
            outcome,
        );
    };
    outcome.qtype = type_name(question.query_type());
    outcome.name = Some(display_name(question.name()));
    let name = wire_name(question.name());
    let known = request.op_code == OpCode::Query
        && question.query_class() == DNSClass::IN
        && name.as_deref().is_some_and(|n| allow.knows_name(n));
    let (code, addr) = match (known, question.query_type(), name) {
        (true, RecordType::A, Some(name)) => match pool.assign(&name) {
            Some(addr) => (ResponseCode::NoError, Some(addr)),
            None => (ResponseCode::ServFail, None),
        },
        (true, RecordType::AAAA, _) => (ResponseCode::NoError, None),
        _ => (ResponseCode::Refused, None),
    };
    outcome.refused = code == ResponseCode::Refused;
    outcome.answered = addr;
    (encode(reply(&request, code, Some(question), addr)), outcome)
}

/// The name a question asks for, canonical, when every label is a host-name label;
/// `None` for anything else (such a name is never allowed).
fn wire_name(name: &Name) -> Option<String> {
    let mut labels = Vec::new();
    for label in name.iter() {
        let label = std::str::from_utf8(label).ok()?;
        // Each label on its own: a '.' inside one label must not pass for two.
        if !is_label(label) {
            return None;
        }
        labels.push(label);
    }
    canonical_name(&labels.join(".")).ok()
}

/// The name as shown in the audit trail: lowercased, no trailing dot, and printable
/// (a byte outside letters, digits, '-' and '_' written as `\DDD`, so a '.' inside a label
/// never reads as a label boundary); the root is ".".
fn display_name(name: &Name) -> String {
    let mut text = String::new();
    for label in name.iter() {
        if !text.is_empty() {
            text.push('.');
        }
        for &byte in label {
            let c = char::from(byte.to_ascii_lowercase());
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                text.push(c);
            } else {
                text.push_str(&format!("\\{byte:03}"));
            }
        }
    }
    if text.is_empty() {
        text.push('.');
    }
    text
}

fn type_name(qtype: RecordType) -> String {
    match qtype {
        RecordType::Unknown(code) => format!("TYPE{code}"),
        known => known.to_string(),
    }
}

fn reply(
    request: &Metadata,
    code: ResponseCode,
    question: Option<&Query>,
    addr: Option<Ipv4Addr>,
) -> Message {
    let mut message = Message::new(request.id, MessageType::Response, request.op_code);
    message.metadata = Metadata::response_from_request(request);
    message.metadata.recursion_available = true;
    message.metadata.response_code = code;
    if let Some(q) = question {
        message.add_query(q.clone());
        if let Some(addr) = addr {
            // The owner name as asked, case included: some clients check it (DNS 0x20).
            message.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(addr))));
        }
    }
    message
}

/// The message's bytes, at most [`MAX_REPLY`]; a reply that would be longer goes out
/// truncated (TC set, no answer), which a client retries over TCP.
fn encode(mut message: Message) -> Option<Vec<u8>> {
    let bytes = message.to_vec().ok()?;
    if bytes.len() <= MAX_REPLY {
        return Some(bytes);
    }
    message.answers.clear();
    message.metadata.truncation = true;
    let bytes = message.to_vec().ok()?;
    (bytes.len() <= MAX_REPLY).then_some(bytes)
}

/// `reply` with DNS-over-TCP's two-byte length prefix; `None` when it is too long for one.
pub fn tcp_frame(reply: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(reply.len()).ok()?;
    let mut framed = Vec::with_capacity(reply.len().saturating_add(2));
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(reply);
    Some(framed)
}

/// The first complete length-prefixed message in `buf` and how many bytes it took with its
/// prefix; `None` until all of it has arrived.
pub fn tcp_message(buf: &[u8]) -> Option<(&[u8], usize)> {
    let prefix: [u8; 2] = buf.get(..2)?.try_into().ok()?;
    let end = usize::from(u16::from_be_bytes(prefix)).checked_add(2)?;
    Some((buf.get(2..end)?, end))
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::op::Edns;
    use proptest::prelude::*;

    use super::*;
    use crate::egress::AllowHost;

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().map(|e| e.parse().unwrap()).collect()).unwrap()
    }

    fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_str(name).unwrap(), qtype));
        m.to_vec().unwrap()
    }

    fn ask(q: &[u8], list: &AllowList, pool: &mut FakePool) -> (Message, DnsOutcome) {
        let (reply, outcome) = answer(q, list, pool);
        let reply = reply.expect("a reply");
        assert!(reply.len() <= MAX_REPLY, "{} bytes", reply.len());
        (Message::from_vec(&reply).unwrap(), outcome)
    }

    fn a_records(m: &Message) -> Vec<Ipv4Addr> {
        m.answers
            .iter()
            .filter_map(|r| match r.data {
                RData::A(A(a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_allowed_name_gets_its_pool_address_for_a_short_time() {
        let list = allow(&["api.example.com:443"]);
        let mut pool = FakePool::new();
        let (m, outcome) = ask(
            &query(77, "api.example.com.", RecordType::A),
            &list,
            &mut pool,
        );
        assert_eq!(m.metadata.id, 77);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.recursion_desired);
        assert_eq!(m.queries.len(), 1);
        assert_eq!(a_records(&m), vec![Ipv4Addr::new(127, 1, 0, 1)]);
        assert_eq!(m.answers[0].ttl, TTL);
        assert_eq!(
            outcome,
            DnsOutcome {
                name: Some("api.example.com".into()),
                qtype: "A".into(),
                answered: Some(Ipv4Addr::new(127, 1, 0, 1)),
                refused: false,
            }
        );
        // The same name in another case: the same address, the case echoed.
        // Uppercase "api" on the wire (hickory lowercases names it is given as text).
        let mut q = query(78, "api.example.com", RecordType::A);
        q[13..16].make_ascii_uppercase();
        let (reply, _) = answer(&q, &list, &mut pool);
        let reply = reply.unwrap();
        assert_eq!(&reply[13..16], b"API", "the question is echoed as asked");
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(a_records(&m), vec![Ipv4Addr::new(127, 1, 0, 1)]);
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn a_wildcard_name_is_answered_but_not_its_bare_suffix() {
        let list = allow(&["*.pypi.org:443"]);
        let mut pool = FakePool::new();
        let (m, _) = ask(&query(1, "files.pypi.org", RecordType::A), &list, &mut pool);
        assert_eq!(a_records(&m).len(), 1);
        let (m, o) = ask(&query(2, "pypi.org", RecordType::A), &list, &mut pool);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(o.refused);
    }

    #[test]
    fn aaaa_for_an_allowed_name_is_an_empty_answer() {
        let list = allow(&["api.example.com:443"]);
        let mut pool = FakePool::new();
        let (m, o) = ask(
            &query(5, "api.example.com", RecordType::AAAA),
            &list,
            &mut pool,
        );
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty());
        assert_eq!(o.qtype, "AAAA");
        assert!(!o.refused);
        assert_eq!(o.answered, None);
        assert!(pool.is_empty());
    }

    #[test]
    fn names_not_allowed_and_other_types_are_refused_with_the_question_echoed() {
        let list = allow(&["api.example.com:443", "198.51.100.7:443"]);
        let mut pool = FakePool::new();
        for (name, qtype) in [
            ("evil.example.com", RecordType::A),
            ("example.com", RecordType::A),
            ("api.example.com", RecordType::TXT),
            ("api.example.com", RecordType::MX),
            ("7.100.51.198.in-addr.arpa", RecordType::PTR),
            ("198.51.100.7", RecordType::A),
        ] {
            let (m, o) = ask(&query(9, name, qtype), &list, &mut pool);
            assert_eq!(
                m.metadata.response_code,
                ResponseCode::Refused,
                "{name} {qtype}"
            );
            assert_eq!(m.metadata.id, 9);
            assert_eq!(m.queries.len(), 1);
            assert!(m.answers.is_empty());
            assert!(o.refused);
        }
        assert!(pool.is_empty());
    }

    #[test]
    fn a_question_outside_class_in_is_refused() {
        let list = allow(&["api.example.com:443"]);
        let mut m = Message::new(3, MessageType::Query, OpCode::Query);
        let mut q = Query::query(Name::from_str("api.example.com").unwrap(), RecordType::A);
        q.set_query_class(DNSClass::CH);
        m.add_query(q);
        let (m, o) = ask(&m.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(o.refused);
    }

    #[test]
    fn a_query_with_another_opcode_is_refused() {
        let list = allow(&["api.example.com:443"]);
        let mut m = Message::new(3, MessageType::Query, OpCode::Status);
        m.add_query(Query::query(
            Name::from_str("api.example.com").unwrap(),
            RecordType::A,
        ));
        let (m, _) = ask(&m.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    }

    #[test]
    fn an_unusual_type_is_logged_by_number() {
        let list = allow(&["api.example.com:443"]);
        let q = query(4, "api.example.com", RecordType::Unknown(65280));
        let (_, o) = ask(&q, &list, &mut FakePool::new());
        assert_eq!(o.qtype, "TYPE65280");
    }

    #[test]
    fn a_name_with_bytes_outside_host_names_is_refused_even_if_it_prints_like_one() {
        let list = allow(&["api.example.com:443"]);
        // One label "api.example" (a dot inside a label) then "com".
        let name = Name::from_labels(vec![b"api.example".to_vec(), b"com".to_vec()]).unwrap();
        let mut m = Message::new(6, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(name, RecordType::A));
        let (m, o) = ask(&m.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert!(o.refused);
        assert_eq!(o.name.as_deref(), Some("api\\046example.com"));
    }

    #[test]
    fn a_full_pool_is_a_server_failure() {
        let list = allow(&["*.example.com:443"]);
        let mut pool = FakePool::new();
        for i in 0..FakePool::CAPACITY {
            pool.assign(&format!("h{i}.example.com")).unwrap();
        }
        let (m, o) = ask(
            &query(8, "new.example.com", RecordType::A),
            &list,
            &mut pool,
        );
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        assert!(m.answers.is_empty());
        assert!(!o.refused);
        // A name already in the pool is still answered.
        let (m, _) = ask(&query(8, "h0.example.com", RecordType::A), &list, &mut pool);
        assert_eq!(a_records(&m), vec![Ipv4Addr::new(127, 1, 0, 1)]);
    }

    #[test]
    fn a_query_with_no_or_two_questions_is_a_format_error() {
        let list = allow(&["api.example.com:443"]);
        let mut none = Message::new(10, MessageType::Query, OpCode::Query);
        none.metadata.recursion_desired = true;
        let (m, o) = ask(&none.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(m.metadata.id, 10);
        assert_eq!(o.name, None);
        let mut two = Message::new(11, MessageType::Query, OpCode::Query);
        for n in ["api.example.com", "api.example.com"] {
            two.add_query(Query::query(Name::from_str(n).unwrap(), RecordType::A));
        }
        let (m, _) = ask(&two.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    }

    #[test]
    fn a_truncated_body_is_a_format_error_and_a_truncated_header_gets_nothing() {
        let list = allow(&["api.example.com:443"]);
        let q = query(12, "api.example.com", RecordType::A);
        let (m, _) = ask(&q[..q.len() - 3], &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(m.metadata.id, 12);
        assert_eq!(answer(&q[..11], &list, &mut FakePool::new()).0, None);
        assert_eq!(answer(&[], &list, &mut FakePool::new()).0, None);
    }

    #[test]
    fn a_response_is_never_answered() {
        let list = allow(&["api.example.com:443"]);
        let mut m = Message::new(13, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(
            Name::from_str("api.example.com").unwrap(),
            RecordType::A,
        ));
        assert_eq!(
            answer(&m.to_vec().unwrap(), &list, &mut FakePool::new()).0,
            None
        );
    }

    #[test]
    fn an_edns_query_is_answered_within_512_bytes() {
        let long = format!(
            "{}.{}.{}.{}.example.com",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(49)
        );
        assert_eq!(long.len(), 253);
        let list =
            AllowList::new(vec![AllowHost::from_str(&format!("{long}:443")).unwrap()]).unwrap();
        let mut m = Message::new(14, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_str(&long).unwrap(), RecordType::A));
        m.set_edns(Edns::new());
        let (m, o) = ask(&m.to_vec().unwrap(), &list, &mut FakePool::new());
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(a_records(&m).len(), 1);
        assert_eq!(o.name.as_deref(), Some(long.as_str()));
    }

    #[test]
    fn tcp_messages_are_framed_and_read_back_one_at_a_time() {
        let a = query(1, "api.example.com", RecordType::A);
        let b = query(2, "api.example.com", RecordType::AAAA);
        let mut stream = tcp_frame(&a).unwrap();
        stream.extend(tcp_frame(&b).unwrap());
        let (first, used) = tcp_message(&stream).unwrap();
        assert_eq!(first, a.as_slice());
        assert_eq!(used, a.len() + 2);
        let (second, used2) = tcp_message(&stream[used..]).unwrap();
        assert_eq!(second, b.as_slice());
        assert_eq!(used + used2, stream.len());
        assert_eq!(tcp_message(&stream[..used - 1]), None);
        assert_eq!(tcp_message(&[0]), None);
        assert_eq!(tcp_message(&[]), None);
        assert_eq!(tcp_frame(&vec![0; 65536]), None);
        assert!(tcp_frame(&vec![0; 65535]).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn arbitrary_bytes_never_panic_the_stub(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let list = allow(&["api.example.com:443", "*.pypi.org:443"]);
            let mut pool = FakePool::new();
            let (reply, _) = answer(&bytes, &list, &mut pool);
            if let Some(reply) = reply {
                prop_assert!(reply.len() <= MAX_REPLY);
            }
            let _ = tcp_message(&bytes);
        }

        #[test]
        fn a_mutated_query_never_panics_the_stub(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let list = allow(&["api.example.com:443"]);
            let mut q = query(1, "api.example.com", RecordType::A);
            for (at, byte) in flips {
                let i = at.index(q.len());
                q[i] = byte;
            }
            let _ = answer(&q, &list, &mut FakePool::new());
        }
    }
}

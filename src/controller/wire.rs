//! Framing for both controller sockets (worker ↔ controller, CLI ↔ controller): a 4-byte
//! big-endian length, then that many bytes of JSON. Frames above [`MAX_FRAME`] are refused
//! before any of the body is read, so a peer cannot make the controller allocate more.
//!
//! The blocking functions serve the in-sandbox client and the CLI; the async ones the
//! controller. A peer that starts a frame and never finishes it is the caller's to time out.

use std::io::{self, Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame body accepted from a peer (workers, API clients) or sent to a worker.
pub const MAX_FRAME: usize = 256 * 1024;
/// Largest response the controller sends an API client (a `ps` of thousands of workers),
/// and so the largest a client accepts.
pub const MAX_RESPONSE: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is larger than the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("the peer closed the connection in the middle of a frame")]
    Truncated,
    #[error("the peer stopped sending in the middle of a frame (for {0:?})")]
    Stalled(std::time::Duration),
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn encode(value: &impl Serialize, limit: usize) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > limit {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut frame = Vec::with_capacity(body.len().saturating_add(4));
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

fn check_len(header: [u8; 4], limit: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > limit {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, value: &impl Serialize) -> Result<(), FrameError> {
    w.write_all(&encode(value, MAX_FRAME)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame; `Ok(None)` when the peer closed cleanly between frames.
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> Result<Option<T>, FrameError> {
    read_frame_limited(r, MAX_FRAME)
}

/// [`read_frame`] with another size limit (a client reading the controller's responses).
pub fn read_frame_limited<T: DeserializeOwned>(
    r: &mut impl Read,
    limit: usize,
) -> Result<Option<T>, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0usize;
    while let Some(rest) = header.get_mut(got..).filter(|r| !r.is_empty()) {
        match r.read(rest) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got = got.saturating_add(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = check_len(header, limit)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    })?;
    decode(&body).map(Some)
}

/// Writes one frame (async).
pub async fn write_frame_async<W: AsyncWrite + Unpin>(
    w: &mut W,
    value: &impl Serialize,
) -> Result<(), FrameError> {
    write_frame_async_limited(w, value, MAX_FRAME).await
}

/// [`write_frame_async`] with another size limit (responses to API clients).
pub async fn write_frame_async_limited<W: AsyncWrite + Unpin>(
    w: &mut W,
    value: &impl Serialize,
    limit: usize,
) -> Result<(), FrameError> {
    w.write_all(&encode(value, limit)?).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame's raw body (async); `Ok(None)` on a clean close between frames. The body
/// is returned undecoded so the caller can audit what it could not parse.
pub async fn read_body_async<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0usize;
    while let Some(rest) = header.get_mut(got..).filter(|r| !r.is_empty()) {
        let n = r.read(rest).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        got = got.saturating_add(n);
    }
    let len = check_len(header, MAX_FRAME)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    })?;
    Ok(Some(body))
}

/// Decodes a body read with [`read_body_async`].
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    decode(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ping {
        n: u32,
    }

    #[test]
    fn frames_round_trip() -> Result<(), FrameError> {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Ping { n: 7 })?;
        write_frame(&mut buf, &Ping { n: 8 })?;
        let mut r = &buf[..];
        assert_eq!(read_frame::<Ping>(&mut r)?, Some(Ping { n: 7 }));
        assert_eq!(read_frame::<Ping>(&mut r)?, Some(Ping { n: 8 }));
        assert_eq!(read_frame::<Ping>(&mut r)?, None);
        Ok(())
    }

    #[test]
    fn oversized_truncated_and_garbage_frames_are_refused() {
        let big = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(
            read_frame::<Ping>(&mut &big[..]),
            Err(FrameError::TooLarge(_))
        ));
        let half = [0u8, 0, 0, 10, b'{'];
        assert!(matches!(
            read_frame::<Ping>(&mut &half[..]),
            Err(FrameError::Truncated)
        ));
        let header_only = [0u8, 0];
        assert!(matches!(
            read_frame::<Ping>(&mut &header_only[..]),
            Err(FrameError::Truncated)
        ));
        let mut garbage = 5u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"nope!");
        assert!(matches!(
            read_frame::<Ping>(&mut &garbage[..]),
            Err(FrameError::Malformed(_))
        ));
        let mut unknown = Vec::new();
        let body = br#"{"n":1,"x":2}"#;
        unknown.extend_from_slice(&(body.len() as u32).to_be_bytes());
        unknown.extend_from_slice(body);
        assert!(matches!(
            read_frame::<Ping>(&mut &unknown[..]),
            Err(FrameError::Malformed(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_reader(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut r = &bytes[..];
            for _ in 0..4 {
                if !matches!(read_frame::<serde_json::Value>(&mut r), Ok(Some(_))) {
                    break;
                }
            }
        }
    }
}

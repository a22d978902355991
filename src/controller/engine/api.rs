//! The API's requests: starting, listing, inspecting and reading the logs of workers,
//! approvals and status (killing is in `kill`).

use std::time::Duration;

use tokio::sync::oneshot;

use serde_json::json;

use crate::audit::event;
use crate::controller::admission::Requester;
use crate::manifest::WorkerId;

use crate::controller::input::Input;
use crate::controller::launcher::{LauncherRequest, LiveUsage};
use crate::controller::protocol::{ApiRequest, ApiResponse};
use crate::controller::registry::WorkerState;

use super::Engine;
use super::admit::api_answer;

/// The longest `ps` waits for the launcher's usage figures.
const PS_WAIT: Duration = Duration::from_millis(40);

/// Most log bytes one `logs` answer carries.
const LOG_CHUNK: usize = 64 * 1024;

/// Up to [`LOG_CHUNK`] bytes of a worker's log from `offset`, as text, and the offset after
/// them. A character cut by the chunk's end is left for the next read, unless the chunk
/// ends the log of a worker that has ended (nothing will complete it); bytes that are not
/// UTF-8 are replaced.
fn read_log(
    workers: Option<&crate::paths::Dir>,
    id: &WorkerId,
    offset: u64,
    ended: bool,
) -> Result<(String, u64), String> {
    use std::io::{Read, Seek, SeekFrom};
    let name = format!("{id}.log");
    let path = format!("workers/{name}");
    // Through the held directory: no symlink, FIFO or device stands in for a log.
    let file = match workers.map(|w| w.open_read(&name)) {
        Some(Ok(Some(f))) => f,
        // A worker that could not start may have no log.
        None | Some(Ok(None)) => return Ok((String::new(), offset)),
        Some(Err(e)) => return Err(format!("cannot read the log {path}: {e}")),
    };
    let mut file = file;
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot read the log {path}: {e}"))?;
    let mut buf = Vec::with_capacity(LOG_CHUNK);
    file.take(LOG_CHUNK as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read the log {path}: {e}"))?;
    // A short read of an ended worker's log is its end; a full chunk may be cut by its size
    // alone, and a live worker may still write the rest of its last character.
    let at_end = ended && buf.len() < LOG_CHUNK;
    let used = if at_end {
        buf.len()
    } else {
        buf.len().saturating_sub(cut_character(&buf))
    };
    let text = String::from_utf8_lossy(buf.get(..used).unwrap_or_default()).into_owned();
    Ok((text, offset.saturating_add(used as u64)))
}

/// How many bytes at the end of `buf` begin a character that bytes after them would
/// complete (0 if it ends whole, or in bytes no later byte could make a character of):
/// judged by the end alone, so invalid bytes earlier in the chunk do not hide a cut.
fn cut_character(buf: &[u8]) -> usize {
    // A character is at most 4 bytes: its first byte is among the last 3 if it is cut.
    let from = buf.len().saturating_sub(3);
    for start in (from..buf.len()).rev() {
        let tail = buf.get(start..).unwrap_or_default();
        if tail.first().is_some_and(|b| b & 0xC0 == 0x80) {
            continue;
        }
        return match std::str::from_utf8(tail) {
            Err(e) if e.error_len().is_none() && e.valid_up_to() == 0 => tail.len(),
            _ => 0,
        };
    }
    0
}

impl Engine {
    /// Whether `uid` may take the decisions that raise risk (approvals, releasing the kill
    /// switch, a child without the approval rules): the controller's owner or root.
    /// Members of `--socket-group` may look, spawn and stop.
    pub(super) fn decides(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }

    pub(super) fn api(
        &mut self,
        uid: u32,
        request: ApiRequest,
        reply: oneshot::Sender<ApiResponse>,
    ) {
        let actor = format!("uid:{uid}");
        match request {
            ApiRequest::Spawn { parent, request } => {
                let outcome = match parent {
                    None => self.spawn_root(*request, &actor),
                    Some(p) => {
                        let requester = if self.decides(uid) {
                            Requester::Person
                        } else {
                            Requester::Member
                        };
                        self.spawn_child(&p, *request, &actor, None, requester)
                    }
                };
                self.answer(reply, api_answer(outcome));
            }
            ApiRequest::Ps(_) => self.ps_request(reply),
            ApiRequest::Kill {
                worker_id,
                recursive,
            } => self.kill(&actor, &worker_id, recursive, reply),
            // Engaging stops things, and anyone who may connect may; releasing undoes
            // the stop, and is the owner's or root's, as deciding an approval is.
            ApiRequest::KillSwitch { release: true, .. } if !self.decides(uid) => {
                let message = format!(
                    "uid {uid} may not release the kill switch (only the controller's owner or root)"
                );
                self.record(
                    event::KILL_SWITCH_RELEASE_REFUSED,
                    &actor,
                    None,
                    json!({ "why": message }),
                    true,
                );
                self.answer(reply, ApiResponse::Error { message });
            }
            ApiRequest::KillSwitch {
                release,
                cluster: true,
            } => self.cluster_kill_switch_request(&actor, release, reply),
            ApiRequest::KillSwitch {
                release: false,
                cluster: false,
            } => self.engage_kill_switch(&actor, reply),
            ApiRequest::KillSwitch {
                release: true,
                cluster: false,
            } => self.release_kill_switch(&actor, reply),
            ApiRequest::ClusterPs(_) => self.cluster_ps(reply),
            ApiRequest::Approvals(_) => {
                let pending = self.pending_approvals.values().cloned().collect();
                self.answer(reply, ApiResponse::Approvals { pending });
            }
            ApiRequest::Approve { approval_id } => {
                let response = self.decide(&approval_id, uid, None);
                self.answer(reply, response);
            }
            ApiRequest::Deny {
                approval_id,
                reason,
            } => {
                let response = self.decide(&approval_id, uid, Some(reason));
                self.answer(reply, response);
            }
            ApiRequest::Inspect { worker_id } => {
                let response = self.inspect(&worker_id);
                self.answer(reply, response);
            }
            ApiRequest::Logs { worker_id, offset } => {
                let response = self.logs(&worker_id, offset);
                self.answer(reply, response);
            }
            ApiRequest::Status(_) => {
                let response = ApiResponse::Status {
                    pid: std::process::id(),
                    session: self.cfg.session.clone(),
                    kill_switch: self.store.kill_switch_engaged(),
                    active: self.registry.active().count() as u64,
                    running: self
                        .registry
                        .active()
                        .filter(|(_, w)| w.state == WorkerState::Registered)
                        .count() as u64,
                    lifetime_total: self.store.lifetime_total(),
                    audit_entries: self.audit.entries(),
                };
                self.answer(reply, response);
            }
        }
    }

    /// Fresh usage if the launcher answers soon, else the last it gave: `ps` never waits
    /// on the launcher for longer than PS_WAIT.
    pub(super) fn ps_request(&mut self, reply: oneshot::Sender<ApiResponse>) {
        // One question to the launcher answers every `ps` that comes while it is asked:
        // before, each asked again, and a flood of them (root's and the owner's are not
        // paced) kept the launcher busy for seconds after it ended, and a spawn waited.
        if self.launcher_alive && !self.pending_ps.is_empty() {
            self.pending_ps.push(reply);
            return;
        }
        if self.launcher_alive && self.send_launcher(&LauncherRequest::Usage, None).is_ok() {
            if self.pending_ps.is_empty() {
                self.effects.wake_after(PS_WAIT, Input::PsDeadline);
            }
            self.pending_ps.push(reply);
        } else {
            let response = self.ps(&self.last_usage);
            self.answer(reply, response);
        }
    }

    pub(super) fn inspect(&self, worker_id: &WorkerId) -> ApiResponse {
        let now = self.effects.now_ms();
        match self.registry.get(worker_id) {
            Some(w) => {
                let mut info = self.registry.info(worker_id, w, now);
                if let Some((_, u)) = self
                    .last_usage
                    .iter()
                    .find(|(u, _)| u == worker_id.as_str())
                {
                    info.usage = Some(u.clone());
                }
                ApiResponse::Worker {
                    info: Box::new(info),
                    manifest: Box::new(w.manifest.clone()),
                }
            }
            None => ApiResponse::Error {
                message: format!("no worker {worker_id} (`hatchery ps --all` lists them)"),
            },
        }
    }

    pub(super) fn logs(&self, worker_id: &WorkerId, offset: u64) -> ApiResponse {
        match self.registry.get(worker_id) {
            // Whether it ended is asked before the log is read: a log read after
            // the end holds everything the worker wrote.
            Some(w) => {
                let ended = !w.state.is_active();
                match read_log(self.cfg.workers.as_ref(), worker_id, offset, ended) {
                    Ok((data, next_offset)) => ApiResponse::Log {
                        data,
                        next_offset,
                        ended,
                        cut_at: w.exit.as_ref().and_then(|e| e.output_cut_at),
                    },
                    Err(message) => ApiResponse::Error { message },
                }
            }
            None => ApiResponse::Error {
                message: format!("no worker {worker_id} (`hatchery ps --all` lists them)"),
            },
        }
    }

    /// Answers every waiting `ps` with the usage figures at hand.
    pub(super) fn answer_ps(&mut self) {
        if self.pending_ps.is_empty() {
            return;
        }
        let resp = self.ps(&self.last_usage);
        for reply in std::mem::take(&mut self.pending_ps) {
            self.answer(reply, resp.clone());
        }
    }

    pub(super) fn ps(&self, usage: &[(String, LiveUsage)]) -> ApiResponse {
        let now = self.effects.now_ms();
        let workers = self
            .registry
            .all()
            .map(|(id, w)| {
                let mut info = self.registry.info(id, w, now);
                if let Some((_, u)) = usage.iter().find(|(u, _)| u == id.as_str()) {
                    info.usage = Some(u.clone());
                }
                info
            })
            .collect();
        ApiResponse::Workers {
            workers,
            kill_switch: self.store.kill_switch_engaged(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(dir: &crate::paths::Dir, id: &WorkerId, ended: bool) -> (String, usize) {
        let (mut text, mut offset, mut reads) = (String::new(), 0u64, 0usize);
        loop {
            let (piece, next) = match read_log(Some(dir), id, offset, ended) {
                Ok(r) => r,
                Err(e) => panic!("{e}"),
            };
            reads = reads.saturating_add(1);
            if next == offset || reads > 100 {
                return (text, reads);
            }
            text.push_str(&piece);
            offset = next;
        }
    }

    #[test]
    fn characters_cut_by_the_chunk_size_are_read_whole_from_an_ended_workers_log()
    -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = crate::paths::Dir::open(tmp.path())?;
        let id = WorkerId::new("w1").map_err(std::io::Error::other)?;
        // 3-byte characters: 64 KiB is no multiple of 3, so chunks end inside one.
        let euros = "€".repeat(100_000);
        std::fs::write(tmp.path().join("w1.log"), &euros)?;
        for ended in [true, false] {
            let (text, _) = read_all(&dir, &id, ended);
            assert_eq!(text.chars().filter(|c| *c == '\u{fffd}').count(), 0);
            assert!(text == euros, "ended: {ended}");
        }
        // Invalid bytes earlier in a chunk do not hide a character cut at its end.
        let mut mixed = vec![b'a'; LOG_CHUNK - 10];
        mixed.push(0xff);
        mixed.extend("€".repeat(10).as_bytes());
        std::fs::write(tmp.path().join("w1.log"), &mixed)?;
        let (text, _) = read_all(&dir, &id, true);
        assert_eq!(
            text.matches('€').count(),
            10,
            "{:?}",
            text.get(text.len() - 40..)
        );
        assert_eq!(text.matches('\u{fffd}').count(), 1);
        // An ended log's last, unfinished character is shown replaced, and the read ends.
        std::fs::write(tmp.path().join("w1.log"), b"ok\xe2\x82")?;
        let (text, reads) = read_all(&dir, &id, true);
        assert_eq!(text, "ok\u{fffd}");
        assert_eq!(reads, 2);
        // A live worker's is kept for the read that completes it.
        let (text, _) = read_all(&dir, &id, false);
        assert_eq!(text, "ok");
        Ok(())
    }
}

#[cfg(test)]
mod cut_tests {
    use super::cut_character;
    use proptest::prelude::*;

    proptest! {
        /// Cut anywhere, valid text loses exactly the bytes of the character the cut
        /// splits; any bytes at all lose at most three, never a whole character.
        #[test]
        fn only_a_split_character_is_kept_back(text in "\\PC{0,40}", at in 0usize..200, junk in proptest::collection::vec(any::<u8>(), 0..40)) {
            let bytes = text.as_bytes();
            let at = at.min(bytes.len());
            let head = bytes.get(..at).unwrap_or_default();
            let whole = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            prop_assert_eq!(cut_character(head), at.saturating_sub(whole));
            let kept = cut_character(&junk);
            prop_assert!(kept <= 3);
            let rest = junk.get(junk.len().saturating_sub(kept)..).unwrap_or_default();
            prop_assert!(std::str::from_utf8(rest).is_err() || kept == 0);
        }
    }
}

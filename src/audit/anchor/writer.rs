//! Writing the anchor: every synced head of the trail, appended to a file that cannot be
//! rewound or sent to syslog, by a thread of its own so the engine never waits on it.

use super::*;

/// Where anchor lines are written.
enum Sink {
    File(File),
    Syslog { socket: UnixDatagram, path: PathBuf },
}

fn connect_syslog(path: &Path) -> io::Result<UnixDatagram> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(path)?;
    Ok(socket)
}

impl Sink {
    fn write(&mut self, lines: &[String]) -> io::Result<()> {
        match self {
            Sink::File(file) => {
                let mut buf = Vec::new();
                for l in lines {
                    buf.extend_from_slice(l.as_bytes());
                    buf.push(b'\n');
                }
                file.write_all(&buf)?;
                file.sync_data()
            }
            Sink::Syslog { socket, path } => {
                let pid = std::process::id();
                for l in lines {
                    let msg = format!("<{SYSLOG_PRIORITY}>{SYSLOG_TAG}[{pid}]: {l}");
                    if socket.send(msg.as_bytes()).is_err() {
                        // The daemon restarted: its socket is a new one.
                        *socket = connect_syslog(path)?;
                        socket.send(msg.as_bytes())?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// An anchor opened at start: written from then on, read once to check the trail.
pub struct Anchor {
    target: AnchorTarget,
    sink: Sink,
    /// A file anchor's directory and name, to read it back.
    file: Option<(Dir, String)>,
}

impl std::fmt::Debug for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Anchor({})", self.target)
    }
}

fn kind_of(mode: u32) -> &'static str {
    match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFSOCK => "a socket",
        _ => "a device",
    }
}

/// Splits a file path into its directory (`.` for a bare name) and one file name.
fn split(path: &Path) -> Option<(PathBuf, String)> {
    let name = path.file_name()?.to_str()?.to_string();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Some((parent, name))
}

/// Opens an anchor file's directory and checks what is at its name (a regular file or
/// nothing): a symlink, FIFO or directory there is refused, as a component of the path
/// that is a symlink is.
fn open_file_dir(path: &Path) -> Result<(Dir, String), AuditError> {
    let shown = path.display().to_string();
    let (parent, name) = split(path).ok_or_else(|| {
        anchor_err(
            &shown,
            None,
            "not a file path (name a file, e.g. /var/log/hatchery/audit.anchor)",
        )
    })?;
    let dir =
        Dir::open(&parent).map_err(|e| anchor_err(&shown, None, format!("its directory: {e}")))?;
    if let Some(st) = dir
        .stat_entry(&name)
        .map_err(|e| anchor_err(&shown, None, e.to_string()))?
    {
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(anchor_err(
                &shown,
                None,
                format!(
                    "is {}, not a regular file: refusing it; name a regular file (or a new name)",
                    kind_of(st.st_mode)
                ),
            ));
        }
    }
    Ok((dir, name))
}

/// Opens an anchor file for reading only (`audit verify --anchor`).
pub fn open_for_reading(path: &Path) -> Result<File, AuditError> {
    let shown = path.display().to_string();
    let (dir, name) = open_file_dir(path)?;
    dir.open_read(&name)
        .map_err(|e| anchor_err(&shown, None, e.to_string()))?
        .ok_or_else(|| anchor_err(&shown, None, "no such file"))
}

impl Anchor {
    /// Opens the anchor once, at start: a file is opened for appending (created 0600,
    /// never truncated, never through a symlink, never a FIFO or directory) and must lie
    /// outside the state directory `state`; syslog is connected.
    pub fn open(target: &AnchorTarget, state: &Dir) -> Result<Anchor, AuditError> {
        let shown = target.to_string();
        match target {
            AnchorTarget::File(path) => {
                let (dir, name) = open_file_dir(path)?;
                let inside = dir
                    .is_within(state)
                    .map_err(|e| anchor_err(&shown, None, e.to_string()))?;
                if inside {
                    return Err(anchor_err(
                        &shown,
                        None,
                        format!(
                            "lies inside the state directory {}, where whoever can roll the trail back can roll the anchor back too: put it in another directory (append-only, e.g. chattr +a) or use --audit-anchor syslog",
                            state.path().display()
                        ),
                    ));
                }
                let file = dir
                    .open_append(&name, 0o600)
                    .map_err(|e| anchor_err(&shown, None, e.to_string()))?;
                Ok(Anchor {
                    target: target.clone(),
                    sink: Sink::File(file),
                    file: Some((dir, name)),
                })
            }
            AnchorTarget::Syslog(path) => {
                let socket = connect_syslog(path).map_err(|e| {
                    anchor_err(
                        &shown,
                        None,
                        format!(
                            "cannot reach the syslog socket: {e}; is journald or a syslog daemon running? (or anchor to a file)"
                        ),
                    )
                })?;
                Ok(Anchor {
                    target: target.clone(),
                    sink: Sink::Syslog {
                        socket,
                        path: path.clone(),
                    },
                    file: None,
                })
            }
        }
    }

    pub fn target(&self) -> &AnchorTarget {
        &self.target
    }

    /// The anchor's content, for a file anchor (syslog cannot be read back here).
    pub fn read(&self) -> Result<Option<File>, AuditError> {
        let Some((dir, name)) = &self.file else {
            return Ok(None);
        };
        dir.open_read(name)
            .map_err(|e| anchor_err(&self.target.to_string(), None, e.to_string()))
    }

    /// The writer for this anchor (its thread starts at the first line submitted).
    pub fn into_writer(self) -> AnchorWriter {
        AnchorWriter {
            name: self.target.to_string(),
            shared: Arc::new(Shared::default()),
            sink: Some(self.sink),
            thread: None,
            held: false,
        }
    }
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<String>,
    /// When the write in progress began.
    busy_since: Option<Instant>,
    /// Why the last write failed (cleared by the next one that succeeds).
    failure: Option<String>,
    /// The newest line of a failed write, tried again.
    retry: Option<String>,
    dropped: u64,
    closing: bool,
    done: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sends anchor lines from a thread of its own, so a slow or full disk (or a stuck
/// syslog) never holds up the controller; failures come back through
/// [`submit`](Self::submit).
pub struct AnchorWriter {
    name: String,
    shared: Arc<Shared>,
    /// The sink, until the thread takes it.
    sink: Option<Sink>,
    thread: Option<JoinHandle<()>>,
    /// Lines are queued but no thread is started (see [`hold`](Self::hold)).
    held: bool,
}

impl AnchorWriter {
    /// While held, lines are queued and no thread is started: a trail begun at start
    /// records its first entry before the controller forks its launcher, and forking
    /// needs a single-threaded process. The thread starts at the first line submitted
    /// once released (after the fork), or when the writer is dropped.
    pub fn hold(&mut self, held: bool) {
        self.held = held;
    }

    /// Takes back the heads queued and not yet written, while no thread has started to
    /// write them (see [`AuditLog::abandon_begun`](super::super::AuditLog::abandon_begun));
    /// `None` once one has, since what it took may be written already.
    pub fn withdraw(&mut self) -> Option<Vec<String>> {
        if self.thread.is_some() {
            return None;
        }
        Some(self.shared.lock().lines.drain(..).collect())
    }

    /// Queues again, first, what [`withdraw`](Self::withdraw) took.
    pub fn put_back(&mut self, lines: Vec<String>) {
        let mut q = self.shared.lock();
        for line in lines.into_iter().rev() {
            q.lines.push_front(line);
        }
    }

    fn start_thread(&mut self) -> Result<(), AuditError> {
        let Some(sink) = self.sink.take() else {
            return Ok(());
        };
        let shared = Arc::clone(&self.shared);
        let name = self.name.clone();
        let handle = std::thread::Builder::new()
            .name("hatchery-anchor".into())
            .spawn(move || write_loop(sink, &shared, &name))
            .map_err(|e| anchor_err(&self.name, None, format!("cannot start its writer: {e}")))?;
        self.thread = Some(handle);
        Ok(())
    }

    /// Queues a line; returns why the anchor is failing, if it is: a write failed and
    /// has not succeeded since, a write has hung for longer than 10 s, or heads were
    /// dropped because the writer fell too far behind.
    pub fn submit(&mut self, line: String) -> Result<(), AuditError> {
        let problem = {
            let mut q = self.shared.lock();
            q.lines.push_back(line);
            if q.lines.len() > MAX_QUEUED {
                q.lines.pop_front();
                q.dropped = q.dropped.saturating_add(1);
            }
            if let Some(f) = &q.failure {
                Some(f.clone())
            } else if let Some(t) = q.busy_since.filter(|t| t.elapsed() > STALL) {
                Some(format!(
                    "a write has not completed for {} s (a slow or hung disk or syslog)",
                    t.elapsed().as_secs()
                ))
            } else if q.dropped > 0 {
                Some(format!(
                    "the writer fell more than {MAX_QUEUED} heads behind"
                ))
            } else {
                None
            }
        };
        self.shared.wake.notify_one();
        if !self.held {
            self.start_thread()?;
        }
        match problem {
            Some(reason) => Err(anchor_err(
                &self.name,
                None,
                format!("cannot be written: {reason}"),
            )),
            None => Ok(()),
        }
    }
}

impl Drop for AnchorWriter {
    /// Writes what is queued (waiting at most 2 s: a stuck anchor must not hold up the
    /// controller's exit).
    fn drop(&mut self) {
        if !self.shared.lock().lines.is_empty() && self.start_thread().is_err() {
            tracing::error!(anchor = %self.name, "the audit anchor did not take the last heads before the controller stopped");
        }
        let Some(handle) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + CLOSE_WAIT;
        let mut q = self.shared.lock();
        q.closing = true;
        self.shared.wake.notify_all();
        while !q.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::error!(anchor = %self.name, queued = q.lines.len(), "the audit anchor did not take the last heads before the controller stopped");
                return;
            }
            q = match self.shared.wake.wait_timeout(q, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        drop(q);
        let _ = handle.join();
    }
}

fn write_loop(mut sink: Sink, shared: &Shared, name: &str) {
    loop {
        let mut batch: Vec<String> = {
            let mut q = shared.lock();
            loop {
                if !q.lines.is_empty() {
                    break;
                }
                if q.closing {
                    q.done = true;
                    shared.wake.notify_all();
                    return;
                }
                if q.retry.is_some() {
                    let (g, timeout) = match shared.wake.wait_timeout(q, RETRY) {
                        Ok(r) => r,
                        Err(e) => e.into_inner(),
                    };
                    q = g;
                    if timeout.timed_out() {
                        break;
                    }
                } else {
                    q = match shared.wake.wait(q) {
                        Ok(g) => g,
                        Err(e) => e.into_inner(),
                    };
                }
            }
            let mut batch: Vec<String> = q.retry.take().into_iter().collect();
            batch.extend(q.lines.drain(..));
            q.busy_since = Some(Instant::now());
            batch
        };
        let result = sink.write(&batch);
        let mut q = shared.lock();
        q.busy_since = None;
        match result {
            Ok(()) => {
                if q.failure.take().is_some() {
                    tracing::warn!(anchor = %name, "the audit anchor is written again");
                }
                q.dropped = 0;
            }
            Err(e) => {
                tracing::error!(anchor = %name, error = %e, "the audit anchor cannot be written; admissions stop at the next decision (kill switch) until it can");
                q.failure = Some(e.to_string());
                q.retry = batch.pop();
            }
        }
    }
}

//! `hatchery agent`: the client a worker uses, from inside its sandbox, to talk to its
//! controller over the socket it inherited (`HATCHERY_FD`). One request at a time.

use clap::{Args, Subcommand};

use hatchery::controller::client::AgentClient;
use hatchery::controller::protocol::{
    Claim, RegisterMsg, ReplicateMsg, ReportMsg, WorkerMessage, WorkerReply,
};
use hatchery::manifest::{FilesystemScope, ResourceSpec};

use super::job::JobArgs;

/// How long `register` waits for the welcome. It is queued before the worker's sandbox
/// starts, so it is there at once unless another process of this worker read it.
const WELCOME_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

const AGENT_EXAMPLES: &str = "\
Each call may be a process of its own; `register` comes first, once (it reads the
controller's welcome, which is sent once). Calls made at once from several processes take
turns on the socket; a `replicate` waiting for a person keeps its turn until the decision.
A call killed before its answer came (`timeout 60 hatchery agent replicate ...`) leaves
that answer, or a later decision, for the next call, which passes over it and says so on
stderr.

Inside a worker (the binary is at /run/hatchery/bin/hatchery, on PATH):
  hatchery agent register
  hatchery agent heartbeat
  hatchery agent replicate --reason 'split the work' -- sh -c 'echo child'
  hatchery agent replicate --reason smaller --explicit --memory 64M -- true
  hatchery agent report 'done: 42 files'
  hatchery agent shutdown

Exit status: 0 ok; 3 denied by the contract; 1 any other error.";

#[derive(Args, Debug)]
#[command(after_help = AGENT_EXAMPLES)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub command: AgentCommand,
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Read the welcome (this worker's id and manifest) and register with the manifest
    Register,
    /// Tell the controller this worker is alive
    Heartbeat,
    /// Ask for a child; without --explicit it inherits this worker's grant
    Replicate(Box<ReplicateArgs>),
    /// Send a task result
    Report {
        /// The result text
        result: String,
    },
    /// Say this worker is done (it is stopped if it does not exit)
    Shutdown,
}

#[derive(Args, Debug)]
pub struct ReplicateArgs {
    /// Why (recorded in the audit trail)
    #[arg(long)]
    pub reason: String,
    /// Send the resources, exposure and profile given by the flags instead of inheriting
    /// this worker's own. A flag not given takes its default (no --allow-host: no host;
    /// --max-output: this worker's cap; --max-egress: this worker's budget), not this
    /// worker's value, and each must be within this worker's grant
    #[arg(long)]
    pub explicit: bool,
    #[command(flatten)]
    pub job: JobArgs,
}

fn print(reply: &WorkerReply) -> i32 {
    super::controller::outln(&hatchery::text::to_json(reply).unwrap_or_default());
    match reply {
        WorkerReply::Denied { .. } => 3,
        WorkerReply::Error { .. } => 1,
        _ => 0,
    }
}

fn run(command: AgentCommand) -> anyhow::Result<i32> {
    let mut client = AgentClient::from_env()?;
    client.when_waiting_for_turn(|| {
        error_line!(
            "note: agent: waiting for another call of this worker to end (a replicate waiting for a person keeps the turn until the decision)"
        );
    });
    let reply = ask(&mut client, command);
    // Whatever became of the call, what it passed over is shown.
    show_passed_over(&mut client);
    Ok(print(&reply?))
}

/// Makes the call `command` asks for; a request answered `pending` waits for its decision.
fn ask(client: &mut AgentClient, command: AgentCommand) -> anyhow::Result<WorkerReply> {
    let reply = match command {
        // The welcome and the registration in one turn: no other call between them.
        AgentCommand::Register => client.exclusive(|client| {
            let manifest = match client.welcome(WELCOME_WAIT)? {
                WorkerReply::Welcome { manifest, .. } => manifest,
                other => anyhow::bail!(
                    "expected the controller's welcome, got {other:?} (already registered?)"
                ),
            };
            Ok(client.call(WorkerMessage::Register(Box::new(RegisterMsg {
                manifest: *manifest,
                call: None,
            })))?)
        })?,
        AgentCommand::Heartbeat => client.call(WorkerMessage::Heartbeat(Claim::default()))?,
        AgentCommand::Replicate(a) => {
            let (resources, filesystem, profile): (
                Option<ResourceSpec>,
                Option<FilesystemScope>,
                _,
            ) = if a.explicit {
                (
                    Some(a.job.resources()?),
                    Some(a.job.filesystem()),
                    Some(a.job.profile.clone()),
                )
            } else {
                (None, None, None)
            };
            let state = a.job.state_snapshot()?;
            let env = a.job.environment()?;
            let request = WorkerMessage::Replicate(Box::new(ReplicateMsg {
                worker_id: None,
                reason: a.reason,
                command: a.job.command,
                state_snapshot: Some(state.as_str().to_string()).filter(|s| !s.is_empty()),
                resources,
                filesystem,
                profile,
                env: (!env.is_empty()).then_some(env),
                cwd: a.job.cwd,
                call: None,
            }));
            // One turn until the decision: another process's call would read it.
            client.exclusive(|client| {
                let reply = client.call(request)?;
                match &reply {
                    WorkerReply::Pending { approval_id, .. } => {
                        // A person decides; the decision follows on the same socket.
                        print(&reply);
                        client.decision(approval_id)
                    }
                    _ => Ok(reply),
                }
            })?
        }
        AgentCommand::Report { result } => client.call(WorkerMessage::Report(ReportMsg {
            worker_id: None,
            result,
            call: None,
        }))?,
        AgentCommand::Shutdown => client.call(WorkerMessage::Shutdown(Claim::default()))?,
    };
    Ok(reply)
}

/// Says on stderr what this call read on its way and set aside: answers to calls that
/// ended before reading them, shown here rather than lost unseen (stdout stays this
/// call's own answer).
fn show_passed_over(client: &mut AgentClient) {
    let (frames, more) = client.take_passed_over();
    for f in &frames {
        let shown = hatchery::text::to_json(f).unwrap_or_default();
        match f.reply.decides() {
            Some(approval) => error_line!(
                "note: agent: passed over the decision on approval {approval} (the call that waited for it has ended): {shown}"
            ),
            None => error_line!(
                "note: agent: passed over an answer to a call that ended before reading it: {shown}"
            ),
        }
    }
    if more > 0 {
        error_line!("note: agent: passed over {more} more");
    }
}

pub fn main(args: AgentArgs) -> i32 {
    match run(args.command) {
        Ok(code) => code,
        Err(e) if super::logging::is_json() => {
            error_line!("agent: {e:#}");
            super::exit::FAILURE
        }
        Err(e) => {
            eprintln!("hatchery agent: {e:#}");
            super::exit::FAILURE
        }
    }
}

//! From a launch to a sandbox: a worker's spec as its manifest and the controller
//! decided (its profile compiled once, its exposures, the agent binary), its log and
//! output pump, its broker's settings.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::broker::BrokerConfig;
use crate::egress::AllowList;
use crate::paths::check_host_path;
use crate::profile::floor::Floor;
use crate::profile::{Profile, SeccompProgram};
use crate::sandbox::cgroup::Limits;
use crate::sandbox::output::OutputPump;
use crate::sandbox::{self, Exposure, RunRequest, SandboxSpec, spec};

use super::{AGENT_BIN_DIR, LaunchSpec, Launcher};

/// A profile as the launcher keeps it: resolved and compiled once, with both seccomp
/// floors it may need (a worker's manifest can add an executable allowlist).
#[derive(Clone)]
pub(super) struct Compiled {
    profile: Profile,
    program: SeccompProgram,
    floor: Floor,
    floor_allowlist: Floor,
}

impl Launcher {
    pub(super) fn profile(&mut self, name: &str) -> Result<Compiled, String> {
        if let Some(p) = self.profiles.get(name) {
            return Ok(p.clone());
        }
        let profile = Profile::builtin(name).map_err(|e| e.to_string())?;
        let program = profile.compile_seccomp().map_err(|e| e.to_string())?;
        let floor = Floor::new(&profile.seccomp, false).map_err(|e| e.to_string())?;
        let floor_allowlist = Floor::new(&profile.seccomp, true).map_err(|e| e.to_string())?;
        let compiled = Compiled {
            profile,
            program,
            floor,
            floor_allowlist,
        };
        self.profiles.insert(name.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// The sandbox spec of a launch with its stdio (through an output pump) and its socket,
    /// and its plan.
    pub(super) fn worker_sandbox(
        &mut self,
        ls: &LaunchSpec,
        egress: Option<&BrokerConfig>,
        host_ids: Option<(u32, u32)>,
        socket: Option<OwnedFd>,
    ) -> Result<(SandboxSpec, sandbox::Plan, Option<OutputPump>), String> {
        let mut spec = self.worker_spec(ls, egress, host_ids)?;
        // Worker logs leave room for the trail; a path the worker writes itself is the
        // kernel's to fill. Said at each launch (not for the sandboxes prepared ahead).
        for bind in &spec.rootfs.exposures {
            if bind.writable && self.state_dev == Some(bind.host.dev) {
                tracing::warn!(
                    worker = %ls.worker_id,
                    path = %bind.host.path.display(),
                    "the worker may write to the state directory's file system: filling it would leave the audit trail no room and stop every worker (keep the state directory on a file system of its own)"
                );
            }
        }
        self.output_budget
            .room_for_a_file()
            .map_err(|why| format!("no log for the worker: {why}"))?;
        let log = self
            .workers
            .create_new(&ls.log_name, 0o600, true)
            .map_err(|e| e.to_string())?;
        let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        // Always through a pump: the worker's own cap and every worker's shared budget
        // hold however the worker writes (a log written directly could fill the disk).
        let (mut pump, [out, err]) =
            OutputPump::new(ls.max_output_bytes, OwnedFd::from(log), OwnedFd::from(err))
                .map_err(|e| format!("output pipes: {e}"))?;
        pump.share_budget(self.output_budget.clone());
        spec.stdio = Some([OwnedFd::from(null), out, err]);
        if let Some(sock) = socket {
            spec.pass_fds.push((sock, 3));
        }
        // Refusals name the controller's own way to go on degraded, not the spawner's.
        let plan = sandbox::preflight(&spec, &self.host, sandbox::Asker::Controller)
            .map_err(|e| e.to_string())?;
        Ok((spec, plan, Some(pump)))
    }

    /// The sandbox spec of a launch, without its stdio and descriptors: as its manifest
    /// and the controller decided, running as `host_ids` when they are given (a prepared
    /// sandbox's) or as ids leased for it.
    pub(super) fn worker_spec(
        &mut self,
        ls: &LaunchSpec,
        egress: Option<&BrokerConfig>,
        host_ids: Option<(u32, u32)>,
    ) -> Result<SandboxSpec, String> {
        if ls.share_network {
            // Half of the host's network (its loopback services, its interfaces) is no
            // policy: a worker reaches named hosts through its broker, never the host's
            // network namespace.
            return Err("allow_external is refused: a worker never shares the host's network namespace; list the hosts it may reach in network_policy.allow_hosts".into());
        }
        let Compiled {
            mut profile,
            program,
            floor,
            floor_allowlist,
        } = self.profile(&ls.profile)?;
        profile
            .narrow_exec(&ls.allow_exec)
            .map_err(|e| e.to_string())?;
        let mut exposures = Vec::new();
        for (paths, writable) in [(&ls.ro, false), (&ls.rw, true)] {
            for p in paths {
                let host = check_host_path(p).map_err(|e| e.to_string())?;
                exposures.push(Exposure { host, writable });
            }
        }
        let mut extra_binds = Vec::new();
        let mut env = ls.env.clone();
        if let Some(bin) = &ls.agent_binary {
            let host = check_host_path(bin).map_err(|e| format!("agent binary: {e}"))?;
            extra_binds.push((host, PathBuf::from(AGENT_BIN_DIR).join("hatchery")));
            env.push((
                "PATH".into(),
                format!("{AGENT_BIN_DIR}:{}", sandbox::DEFAULT_PATH),
            ));
        }
        let request = RunRequest {
            command: ls.command.clone(),
            env,
            cwd: ls.cwd.as_ref().map(PathBuf::from),
            exposures,
            limits: Limits {
                memory: ls.memory,
                cpus: ls.cpus,
                pids: ls.pids,
            },
            host_ids,
            hostname: ls.worker_id.clone(),
            allow_degraded: ls.allow_degraded,
            cgroup_name: ls.cgroup_name.clone(),
            extra_binds,
            payload_ids: ls.payload_ids,
            egress_ports: egress.map(|c| c.ports.clone()),
        };
        let floor = if profile.landlock.allow_exec.is_some() {
            &floor_allowlist
        } else {
            &floor
        };
        let mut spec = spec::build_compiled(request, &profile, program, floor, None)
            .map_err(|e| e.to_string())?;
        if ls.agent_binary.is_some() {
            spec.landlock.read.push(PathBuf::from(AGENT_BIN_DIR));
            spec.landlock.execute.push(PathBuf::from(AGENT_BIN_DIR));
        }
        Ok(spec)
    }

    /// The broker settings of a worker whose manifest allows hosts.
    pub(super) fn egress(&self, ls: &LaunchSpec) -> Result<Option<BrokerConfig>, String> {
        let Some(e) = &ls.egress else {
            return Ok(None);
        };
        let mut allow = AllowList::new(e.allow_hosts.clone()).map_err(|e| e.to_string())?;
        if e.any_public {
            allow = allow.with_any_public();
        }
        let ports = allow.ports().into_iter().collect();
        Ok(Some(BrokerConfig {
            allow,
            resolution: self.resolution.clone(),
            max_bytes: e.max_bytes,
            ports,
        }))
    }
}

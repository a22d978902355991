//! The controller's admission decisions, without effects: who may start, who may
//! register, who must go ([`reaping`]). Each decision takes the state it needs (the contract, the
//! [`AdmissionStore`], a manifest or request) and the time, and returns what to do; the
//! engine does it (records it in the audit trail, hands the worker to the launcher,
//! replies). Nothing here does I/O or reads the clock, so every rule is tested without
//! root or sockets (see `tests.rs`).

pub mod reaping;
mod store;

pub use store::{AdmissionStore, InMemoryStore, Slot};

use crate::contract::approval::ApprovalVerdict;
use crate::contract::{Decision, DenyReason, IssueError, RegistryView, ReplicationContract};
use crate::manifest::{Manifest, SpawnRequest, WorkerId};
use crate::signing::{ManifestSigner, VerifyError};

/// The request a manifest grants (what a child's manifest is re-checked as).
pub fn request_of(manifest: &Manifest) -> SpawnRequest {
    SpawnRequest {
        resources: manifest.resources.clone(),
        filesystem: manifest.filesystem.clone(),
        profile: manifest.profile.clone(),
        command: manifest.command.clone(),
        env: manifest.env.clone(),
        cwd: manifest.cwd.clone(),
        state_snapshot: manifest.state_snapshot.clone(),
    }
}

/// What a request to start a worker came to, once the engine acted on it.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Handed to the launcher.
    Started { worker_id: WorkerId, depth: u32 },
    /// Its manifest is issued and waits for a person's decision.
    Pending {
        approval_id: String,
        child_id: WorkerId,
        /// The approval rules that matched.
        rules: Vec<String>,
    },
    /// Refused: the audit trail's event for it, and why.
    Denied { event: String, reason: String },
    /// Allowed or not, it could not be carried out.
    Failed(String),
}

/// Who a worker about to start is, for the contract's checks.
pub enum Candidate<'a> {
    /// A root worker (asked for by a person): checked as a registration.
    Root(&'a Manifest),
    /// A child of `parent`: checked as a replication of the parent, granting what the
    /// child's manifest holds.
    Child {
        parent: &'a Manifest,
        manifest: &'a Manifest,
    },
}

impl Candidate<'_> {
    fn manifest(&self) -> &Manifest {
        match self {
            Candidate::Root(m) => m,
            Candidate::Child { manifest, .. } => manifest,
        }
    }

    /// The contract's decision over `view` at `now`.
    pub fn check(
        &self,
        contract: &ReplicationContract,
        view: &dyn RegistryView,
        now: u64,
    ) -> Decision {
        match self {
            Candidate::Root(m) => contract.admit(m, view, now),
            Candidate::Child { parent, manifest } => {
                contract.can_spawn(parent, &request_of(manifest), view, now)
            }
        }
    }
}

/// Takes a slot for `candidate` if the contract allows it now: the check and the count in
/// one step of the store (see [`AdmissionStore::reserve`]).
pub fn reserve(
    store: &mut dyn AdmissionStore,
    contract: &ReplicationContract,
    candidate: &Candidate<'_>,
    now: u64,
) -> Decision {
    let slot = Slot::of(candidate.manifest());
    store.reserve(slot, now, &|view| candidate.check(contract, view, now))
}

/// What a replication request comes to before anything takes effect.
#[derive(Debug)]
pub enum ChildDecision {
    /// The contract allows it: its signed manifest, and whether a person must approve it.
    Issued {
        manifest: Box<Manifest>,
        approval: ApprovalVerdict,
    },
    /// Refused by the controller or the contract.
    Denied(DenyReason),
    /// No manifest could be made (signing failed).
    Failed(String),
}

/// Who asks for a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester {
    /// A person who may decide approvals (the controller's owner or root) through the
    /// API: that person is the approver.
    Person,
    /// A member of `--socket-group` through the API, who may not decide approvals: the
    /// request goes through the contract's approval rules, as the parent's own would
    /// (otherwise `spawn --parent` made exactly the child a person was to decide on), and
    /// one that needs a person is refused.
    Member,
    /// The parent itself: its request goes through the contract's approval rules.
    Parent,
}

/// A request for a child of a registered worker.
pub struct ChildRequest<'a> {
    /// The parent's verified manifest.
    pub parent: &'a Manifest,
    pub request: SpawnRequest,
    /// The id the child gets if it is allowed.
    pub child_id: WorkerId,
    pub requester: Requester,
}

/// Decides a request for a child and issues the child's manifest when the contract allows
/// it. The store is only read: the slot is taken with [`reserve`] when the child starts.
pub fn decide_child(
    contract: &ReplicationContract,
    signer: &ManifestSigner,
    view: &dyn RegistryView,
    asked: ChildRequest<'_>,
    now: u64,
) -> ChildDecision {
    let ChildRequest {
        parent,
        mut request,
        child_id,
        requester,
    } = asked;
    // A child that names no output cap gets its parent's, as a root gets the
    // controller's: leaving the cap out is not asking for more.
    if request.resources.max_output_bytes.is_none() {
        request.resources.max_output_bytes = parent.resources.max_output_bytes;
    }
    // Likewise the egress budget of a child that reaches any host.
    let net = &mut request.resources.network_policy;
    if net.max_egress_bytes.is_none() && net.reaches_hosts() {
        net.max_egress_bytes = parent.resources.network_policy.max_egress_bytes;
    }
    match contract.issue_child(signer, parent, request, child_id, view, now) {
        Ok(manifest) => {
            let approval = match requester {
                Requester::Person => ApprovalVerdict::NotNeeded,
                Requester::Member | Requester::Parent => {
                    contract
                        .approval
                        .evaluate(parent, &request_of(&manifest), manifest.depth.get())
                }
            };
            ChildDecision::Issued {
                manifest: Box::new(manifest),
                approval,
            }
        }
        Err(IssueError::Denied(r)) => ChildDecision::Denied(r),
        Err(IssueError::Sign(e)) => ChildDecision::Failed(e.to_string()),
    }
}

/// What a worker presenting a manifest at registration comes to.
#[derive(Debug)]
pub enum Registration {
    Accepted,
    /// Not the manifest this worker was issued (another worker's, or a forgery); what
    /// verifying it on its own says, if it fails.
    NotIssued {
        verification: Option<String>,
    },
    /// Its own manifest, refused by the signature, time or replay checks.
    Unverified(VerifyError),
    /// The contract refuses it now (the world changed since it was allowed).
    Denied(DenyReason),
}

/// Decides a registration: the presented manifest must be exactly the one issued, verify
/// (which also remembers its nonce), and pass the contract's admission with the worker
/// itself not counted (`view`).
pub fn decide_registration(
    contract: &ReplicationContract,
    signer: &mut ManifestSigner,
    view: &dyn RegistryView,
    issued: Option<&Manifest>,
    presented: &Manifest,
    now: u64,
) -> Registration {
    if issued != Some(presented) {
        let verification = signer
            .authenticate(presented, now)
            .err()
            .map(|e| e.to_string());
        return Registration::NotIssued { verification };
    }
    if let Err(e) = signer.verify(presented, now) {
        return Registration::Unverified(e);
    }
    match contract.admit(presented, view, now) {
        Decision::Allow => Registration::Accepted,
        Decision::Deny(r) => Registration::Denied(r),
    }
}

#[cfg(test)]
mod tests;

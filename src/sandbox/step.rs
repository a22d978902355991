//! The one error every step between clone and execve returns: which step, the errno,
//! and (sometimes) a detail such as the path involved.
//!
//! Why one type: the launch order reads as a list of `step()?` calls only when every
//! step fails the same way, and the supervisor reports exactly what the sandbox sent
//! (the step name is what the user reads after "sandbox setup failed at").
//!
//! The step name is borrowed when it is a literal, so a step that succeeds allocates
//! nothing here; a failure allocates no more than the report it becomes.

use std::borrow::Cow;
use std::io;

use super::caps::PrivError;
use super::channel::FromSandbox;
use super::mount_api::MountError;

/// A failed step of the sandbox's own set-up.
#[derive(Debug)]
pub struct Step {
    pub step: Cow<'static, str>,
    pub errno: i32,
    /// Empty unless the step names what it acted on.
    pub detail: String,
}

impl Step {
    pub fn new(step: impl Into<Cow<'static, str>>, errno: i32) -> Step {
        Step {
            step: step.into(),
            errno,
            detail: String::new(),
        }
    }

    pub fn with_detail(self, detail: String) -> Step {
        Step { detail, ..self }
    }
}

/// Names the step a lower-level error happened in.
pub trait StepResult<T> {
    fn step(self, step: &'static str) -> Result<T, Step>;
}

impl<T> StepResult<T> for nix::Result<T> {
    fn step(self, step: &'static str) -> Result<T, Step> {
        self.map_err(|e| Step::new(step, e as i32))
    }
}

/// An io error without an OS errno (none of the steps make one) counts as EIO.
impl<T> StepResult<T> for io::Result<T> {
    fn step(self, step: &'static str) -> Result<T, Step> {
        self.map_err(|e| Step::new(step, e.raw_os_error().unwrap_or(libc::EIO)))
    }
}

/// Steps that report a bare errno (terminal, seccomp).
impl<T> StepResult<T> for Result<T, i32> {
    fn step(self, step: &'static str) -> Result<T, Step> {
        self.map_err(|errno| Step::new(step, errno))
    }
}

impl From<MountError> for Step {
    fn from(e: MountError) -> Step {
        Step::new(e.step, e.errno)
    }
}

impl From<PrivError> for Step {
    fn from(e: PrivError) -> Step {
        Step::new(e.step, e.errno)
    }
}

/// The kernel object limits name the limit file they failed on.
impl From<(String, nix::errno::Errno)> for Step {
    fn from((step, e): (String, nix::errno::Errno)) -> Step {
        Step::new(step, e as i32)
    }
}

/// What the sandbox sends its supervisor about a failed step.
impl From<Step> for FromSandbox {
    fn from(s: Step) -> FromSandbox {
        FromSandbox::SetupFailed {
            step: s.step.into_owned(),
            errno: s.errno,
            detail: s.detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_reaches_the_supervisor_with_its_name_errno_and_detail() {
        let sent: FromSandbox = Err::<(), _>(nix::errno::Errno::ENOENT)
            .step("working directory")
            .map_err(|s| s.with_detail("/nowhere".into()))
            .unwrap_err()
            .into();
        assert_eq!(
            sent,
            FromSandbox::SetupFailed {
                step: "working directory".into(),
                errno: libc::ENOENT,
                detail: "/nowhere".into(),
            }
        );
    }
}

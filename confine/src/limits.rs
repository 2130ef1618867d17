//! `no_new_privs` and resource limits.

use rustix::process::{Resource, Rlimit, setrlimit};
use serde::{Deserialize, Serialize};

use crate::ConfineError;

/// Resource limits, each set as both soft and hard limit (the process cannot
/// raise them again). `None` leaves a limit as inherited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// `RLIMIT_NOFILE`: one more than the highest file descriptor number.
    pub nofile: Option<u64>,
    /// `RLIMIT_CORE` in bytes; 0 means no core dumps (which could hold guest
    /// memory or credentials).
    pub core: Option<u64>,
    /// `RLIMIT_FSIZE` in bytes: the largest file the process may write
    /// (`SIGXFSZ` beyond it).
    pub fsize: Option<u64>,
}

impl Default for Rlimits {
    /// 1024 files, no core dumps, files up to 1 GiB.
    fn default() -> Self {
        Self {
            nofile: Some(1024),
            core: Some(0),
            fsize: Some(1 << 30),
        }
    }
}

impl Rlimits {
    /// Applies the limits to the calling process.
    ///
    /// # Errors
    /// [`ConfineError::Rlimit`] naming the limit that failed (e.g. raising a
    /// hard limit without privilege).
    pub fn apply(&self) -> Result<(), ConfineError> {
        for (resource, name, value) in [
            (Resource::Nofile, "RLIMIT_NOFILE", self.nofile),
            (Resource::Core, "RLIMIT_CORE", self.core),
            (Resource::Fsize, "RLIMIT_FSIZE", self.fsize),
        ] {
            if let Some(v) = value {
                let limit = Rlimit {
                    current: Some(v),
                    maximum: Some(v),
                };
                setrlimit(resource, limit).map_err(|e| ConfineError::Rlimit {
                    resource: name,
                    source: e.into(),
                })?;
            }
        }
        Ok(())
    }
}

/// Sets `no_new_privs` on the calling thread (inherited by its children and
/// kept across `execve`): setuid/setgid bits and file capabilities no longer
/// grant anything. It cannot be unset.
///
/// # Errors
/// [`ConfineError::NoNewPrivs`].
pub fn set_no_new_privs() -> Result<(), ConfineError> {
    rustix::thread::set_no_new_privs(true).map_err(|e| ConfineError::NoNewPrivs(e.into()))
}

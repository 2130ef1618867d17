//! Landlock rulesets.
//!
//! A [`LandlockRules`] lists what stays allowed; everything else of what the
//! running kernel can restrict is denied: every filesystem access right
//! (up to ABI 7), TCP bind and connect (ABI 4+) except the listed ports, and,
//! with ABI 6+, signals to and abstract unix sockets of processes outside the
//! sandbox.
//!
//! Landlock confines the calling thread and the threads and processes it
//! creates afterwards; on kernels without `LANDLOCK_RESTRICT_SELF_TSYNC`
//! sibling threads that already exist stay unconfined.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

use crate::ConfineError;

/// The newest Landlock ABI whose rights we request (and have tested).
const TESTED_ABI: ABI = ABI::V7;

/// What a Landlock-confined process may still do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockRules {
    /// Files and directories (with everything beneath) it may read.
    pub read: Vec<PathBuf>,
    /// Files and directories it may read and execute.
    pub read_exec: Vec<PathBuf>,
    /// Files and directories it may read and write (create, remove,
    /// truncate beneath a directory), but not execute.
    pub read_write: Vec<PathBuf>,
    /// Files it may write to but not read (e.g. an append-only audit log).
    pub write_only: Vec<PathBuf>,
    /// Directories in which it may create unix sockets and remove files
    /// (a listener's socket path, and a stale socket left there), nothing
    /// else: no reading, no other file types.
    #[serde(default)]
    pub socket_dirs: Vec<PathBuf>,
    /// TCP ports it may bind. Empty: no TCP bind at all.
    pub tcp_bind: Vec<u16>,
    /// TCP ports it may connect to. `None`: connect is not restricted;
    /// `Some(empty)`: no TCP connect at all.
    pub tcp_connect: Option<Vec<u16>>,
}

/// What the kernel enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LandlockOutcome {
    /// Every requested restriction is enforced.
    Full,
    /// Some are (the kernel's ABI is older than [`TESTED_ABI`]); the text says
    /// which class is missing.
    Partial(String),
}

impl LandlockRules {
    /// Confines the calling thread (see the module doc for threads). Also
    /// sets `no_new_privs`.
    ///
    /// # Errors
    /// [`ConfineError::LandlockUnavailable`] when the kernel enforces nothing
    /// (Landlock disabled or absent); [`ConfineError::Landlock`] when a path
    /// cannot be opened or the ruleset is refused.
    pub fn restrict_self(&self) -> Result<LandlockOutcome, ConfineError> {
        let err = |e: &dyn std::fmt::Display| ConfineError::Landlock(e.to_string());
        let fs_all = AccessFs::from_all(TESTED_ABI);
        let fs_read = AccessFs::from_read(TESTED_ABI);
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(fs_all)
            .map_err(|e| err(&e))?
            .handle_access(AccessNet::BindTcp)
            .map_err(|e| err(&e))?;
        if self.tcp_connect.is_some() {
            ruleset = ruleset
                .handle_access(AccessNet::ConnectTcp)
                .map_err(|e| err(&e))?;
        }
        ruleset = ruleset
            .scope(Scope::from_all(TESTED_ABI))
            .map_err(|e| err(&e))?;
        let mut created = ruleset.create().map_err(|e| err(&e))?;
        let classes: [(&[PathBuf], BitFlags<AccessFs>); 5] = [
            (&self.read, fs_read & !AccessFs::Execute),
            (&self.read_exec, fs_read),
            (&self.read_write, fs_all & !AccessFs::Execute),
            (&self.write_only, AccessFs::from_write(TESTED_ABI)),
            (&self.socket_dirs, AccessFs::MakeSock | AccessFs::RemoveFile),
        ];
        for (paths, access) in classes {
            for path in paths {
                let fd = PathFd::new(path).map_err(|e| {
                    ConfineError::Landlock(format!("opening {}: {e}", path.display()))
                })?;
                let access = if std::fs::metadata(path).is_ok_and(|m| !m.is_dir()) {
                    access & AccessFs::from_file(TESTED_ABI)
                } else {
                    access
                };
                created = created
                    .add_rule(PathBeneath::new(fd, access))
                    .map_err(|e| err(&e))?;
            }
        }
        for &port in &self.tcp_bind {
            created = created
                .add_rule(NetPort::new(port, AccessNet::BindTcp))
                .map_err(|e| err(&e))?;
        }
        for &port in self.tcp_connect.iter().flatten() {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|e| err(&e))?;
        }
        let status = created.restrict_self().map_err(|e| err(&e))?;
        match status.ruleset {
            RulesetStatus::FullyEnforced => Ok(LandlockOutcome::Full),
            RulesetStatus::PartiallyEnforced => Ok(LandlockOutcome::Partial(format!(
                "kernel {:?} is older than {TESTED_ABI:?}",
                status.landlock
            ))),
            RulesetStatus::NotEnforced => Err(ConfineError::LandlockUnavailable(format!(
                "{:?}",
                status.landlock
            ))),
        }
    }
}

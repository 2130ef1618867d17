//! Applying, listing and deleting our tables through `nft`, and the one
//! error type of the crate.

use std::path::{Path, PathBuf};

use nftables::helper::{self, NftablesError};
use nftables::schema::{NfCmd, NfListObject, NfObject, Nftables, Table};
use nftables::types::NfFamily;
use thiserror::Error;

/// Why a floor could not be installed, verified or removed. Each message is
/// one line that says what to do.
#[derive(Debug, Error)]
pub enum FloorError {
    /// `nft` is not installed or could not be run.
    #[error("cannot run nft ({0}); install the nftables package")]
    NftMissing(String),
    /// `nft` refused the rules (an interface that does not exist, no
    /// permission, a kernel without nftables).
    #[error("nft refused the {what}: {stderr}")]
    NftFailed {
        /// Which rules.
        what: &'static str,
        /// nft's own message, on one line.
        stderr: String,
    },
    /// The rules listed back are not the rules applied.
    #[error("the {what} did not verify: {detail}")]
    Verify {
        /// Which rules.
        what: &'static str,
        /// What differed.
        detail: String,
    },
    /// The namespace path could not be opened or entered.
    #[error("network namespace {path}: {message}")]
    Netns {
        /// The path given.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The interface is not in the namespace.
    #[error("no interface `{iface}` in {netns}")]
    NoInterface {
        /// The interface asked for.
        iface: String,
        /// Which namespace (a path, or "this network namespace").
        netns: String,
    },
    /// The guest's interface could not be set down (the floor is then
    /// never removed): why, and what became of its floor.
    #[error("cannot set `{iface}` down ({message}); {floor}")]
    LinkDown {
        /// The interface.
        iface: String,
        /// Why.
        message: String,
        /// What became of the floor: put back, left as it was, or why
        /// putting it back failed too.
        floor: String,
    },
    /// Something of someone else's sees the interface's frames before the
    /// floor's drop (or the gateway's on their way to the guest).
    #[error(
        "`{iface}` has {what}, which sees its frames outside the floor: remove it or attach to an interface without one"
    )]
    Bypass {
        /// The interface.
        iface: String,
        /// What was found.
        what: String,
    },
    /// An argument that cannot be used (an interface name too long, say).
    #[error("{0}")]
    Invalid(String),
    /// What else might see the interface's frames (tc, XDP, tcx: the
    /// caller's check given to [`crate::ingress::IngressFloor::check_with`])
    /// could not be looked at.
    #[error("cannot look for what sees `{iface}`'s frames outside nftables: {message}")]
    Probe {
        /// The interface.
        iface: String,
        /// Why.
        message: String,
    },
}

impl FloorError {
    /// Whether the error may pass on its own (a failed run of `nft`, `ip`
    /// or `tc`, a thread or socket that could not be had, a ruleset that
    /// changed while it was read), rather than say the floor no longer
    /// holds ([`Self::Verify`], [`Self::Bypass`]) or the interface is gone
    /// ([`Self::NoInterface`]): worth asking again before concluding.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::NftMissing(_)
            | Self::NftFailed { .. }
            | Self::Netns { .. }
            | Self::Invalid(_)
            | Self::Probe { .. } => true,
            Self::Verify { .. }
            | Self::Bypass { .. }
            | Self::NoInterface { .. }
            | Self::LinkDown { .. } => false,
        }
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) fn map_err(what: &'static str, e: NftablesError) -> FloorError {
    match e {
        NftablesError::NftExecution { program, inner } => {
            FloorError::NftMissing(format!("{}: {inner}", program.to_string_lossy()))
        }
        NftablesError::NftFailed { stderr, .. } => FloorError::NftFailed {
            what,
            stderr: one_line(&stderr),
        },
        other => FloorError::NftFailed {
            what,
            stderr: one_line(&other.to_string()),
        },
    }
}

/// Where `nft` is looked for, in this order: absolute paths only, the
/// same for every process that runs it (the gateway installs the floor
/// with its `PATH`, the keeper checks it with an emptied environment, and
/// two different `nft` binaries could print the same ruleset differently).
const NFT_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The `nft` binary: the first of [`NFT_DIRS`] that holds one (a bare
/// `nft` when none does, whose run then fails with [`FloorError::NftMissing`]).
pub(crate) fn program() -> PathBuf {
    NFT_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("nft"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nft"))
}

/// Applies `objects` as one transaction (all or nothing).
pub(crate) fn apply(what: &'static str, objects: Vec<NfObject<'static>>) -> Result<(), FloorError> {
    let ruleset = Nftables {
        objects: objects.into(),
    };
    helper::apply_ruleset_with_args(&ruleset, Some(&program()), helper::DEFAULT_ARGS)
        .map_err(|e| map_err(what, e))
}

/// Lists one table (`nft -j list table FAMILY NAME`).
pub(crate) fn list_table(
    what: &'static str,
    family: &str,
    name: &str,
) -> Result<Nftables<'static>, FloorError> {
    helper::get_current_ruleset_with_args(Some(&program()), ["list", "table", family, name])
        .map_err(|e| map_err(what, e))
}

/// `nft list ...` as text.
pub(crate) fn list_text(what: &'static str, args: &[&str]) -> Result<String, FloorError> {
    let mut all = vec!["list"];
    all.extend_from_slice(args);
    output(what, &all)
}

/// What `nft ARGS` prints (in the calling thread's namespace).
pub(crate) fn output(what: &'static str, args: &[&str]) -> Result<String, FloorError> {
    let out = std::process::Command::new(program())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| FloorError::NftMissing(format!("nft: {e}")))?;
    if !out.status.success() {
        return Err(FloorError::NftFailed {
            what,
            stderr: one_line(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Deletes our table `name` of `family`; a table already gone is fine (it
/// is added first in the same transaction, so the delete always finds it).
pub(crate) fn delete_table(
    what: &'static str,
    family: NfFamily,
    name: &str,
) -> Result<(), FloorError> {
    let table = Table {
        family,
        name: name.to_owned().into(),
        handle: None,
    };
    apply(
        what,
        vec![
            NfObject::CmdObject(NfCmd::Add(NfListObject::Table(table.clone()))),
            NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(table))),
        ],
    )
}

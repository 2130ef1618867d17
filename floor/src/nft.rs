//! Applying, listing and deleting our tables through `nft`, and the one
//! error type of the crate.

use std::path::{Path, PathBuf};

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
    /// The floor's interface now has a name nft could read as more than
    /// the one interface (`tap*`): its floor is not applied on it (the
    /// tables stay as they were) and the interface was set down, or
    /// `cut` says why not.
    #[error(
        "the floor's interface is now named `{name}`, which nft could read as more than one interface: its floor was not applied on that name (its tables stay as they were), and {cut}"
    )]
    UnsafeName {
        /// The interface's name now.
        name: String,
        /// What became of the link ("it was set down", or why not).
        cut: String,
    },
    /// At the floor's end the interface is down and its floor back on
    /// it, but something of someone else's still sees its frames outside
    /// the floor (tc, XDP, tcx, a foreign chain ahead of it), which no
    /// nftables rule outranks: only the link being down holds them.
    #[error(
        "`{iface}` is down and its floor back on it, but it has {what}, which sees its frames outside the floor: only the link being down holds them now; remove it"
    )]
    Outranked {
        /// The interface.
        iface: String,
        /// What was found, or why it could not be looked for.
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
            | Self::LinkDown { .. }
            | Self::UnsafeName { .. }
            | Self::Outranked { .. } => false,
        }
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where `nft` is looked for, in this order: absolute paths only, the
/// same for every process that runs it (the gateway installs the floor
/// with its `PATH`, the keeper checks it with an emptied environment, and
/// two different `nft` binaries could print the same ruleset differently).
const NFT_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The `nft` found by the process's first run of it (the floor's
/// install), which every later run uses: the keeper, forked after it,
/// inherits it, so the floor is checked and removed by the very binary
/// that installed it.
static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The `nft` binary: the first of [`NFT_DIRS`] that holds one, never one
/// of `PATH`'s (which the gateway's caller chooses).
///
/// # Errors
/// [`FloorError::NftMissing`] when none does.
pub(crate) fn program() -> Result<PathBuf, FloorError> {
    if let Some(found) = PROGRAM.get() {
        return Ok(found.clone());
    }
    let found = find_in(&NFT_DIRS)?;
    Ok(PROGRAM.get_or_init(|| found).clone())
}

/// The first of `dirs` that holds an `nft`.
fn find_in(dirs: &[&str]) -> Result<PathBuf, FloorError> {
    dirs.iter()
        .map(|dir| Path::new(dir).join("nft"))
        .find(|p| p.is_file())
        .ok_or_else(|| FloorError::NftMissing(format!("no nft in {}", dirs.join(", "))))
}

/// Applies `objects` as one transaction (all or nothing).
pub(crate) fn apply(what: &'static str, objects: Vec<NfObject<'static>>) -> Result<(), FloorError> {
    let ruleset = Nftables {
        objects: objects.into(),
    };
    let json = serde_json::to_string(&ruleset).map_err(|e| FloorError::NftFailed {
        what,
        stderr: format!("cannot write the rules as JSON: {e}"),
    })?;
    run(what, &["-j", "-f", "-"], json.as_bytes()).map(drop)
}

/// Lists one table (`nft -j list table FAMILY NAME`).
pub(crate) fn list_table(
    what: &'static str,
    family: &str,
    name: &str,
) -> Result<Nftables<'static>, FloorError> {
    let json = run(what, &["-j", "list", "table", family, name], b"")?;
    serde_json::from_str(&json).map_err(|e| FloorError::NftFailed {
        what,
        stderr: one_line(&format!("nft printed JSON that does not read: {e}")),
    })
}

/// `nft list ...` as text.
pub(crate) fn list_text(what: &'static str, args: &[&str]) -> Result<String, FloorError> {
    let mut all = vec!["list"];
    all.extend_from_slice(args);
    output(what, &all)
}

/// What `nft ARGS` prints (in the calling thread's namespace).
pub(crate) fn output(what: &'static str, args: &[&str]) -> Result<String, FloorError> {
    run(what, args, b"")
}

/// Runs `nft ARGS` with `input` on its standard input, killed when it
/// has not ended within [`crate::run::DEADLINE`] (a hung `nft` is a
/// failed run: transient, asked again), and returns what it printed.
fn run(what: &'static str, args: &[&str], input: &[u8]) -> Result<String, FloorError> {
    let mut cmd = std::process::Command::new(program()?);
    cmd.args(args);
    let out = crate::run::output_within(&mut cmd, input, crate::run::DEADLINE).map_err(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            FloorError::NftFailed {
                what,
                stderr: format!("nft {}", e),
            }
        } else {
            FloorError::NftMissing(format!("nft: {e}"))
        }
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `nft` is looked for in fixed directories only: none holding one
    /// is an error, never a run of whatever `PATH` names.
    #[test]
    fn no_nft_in_the_fixed_directories_is_an_error_not_a_path_search() {
        let empty = std::env::temp_dir().join(format!("sluice-no-nft-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = find_in(&[empty.to_str().unwrap()]).unwrap_err();
        std::fs::remove_dir(&empty).unwrap();
        assert!(matches!(e, FloorError::NftMissing(_)), "{e}");
        assert!(e.to_string().contains("no nft in"), "{e}");
    }
}

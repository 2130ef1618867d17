//! The ingress floor: in the VM's namespace, nothing the guest sends
//! reaches the kernel's stack, and nothing is forwarded.
//!
//! The end of a gateway that served the interface is fail-closed
//! ([`IngressFloor::remove`]): the interface is set down (a TAP that is
//! down refuses its VMM's writes, a veth that is down receives nothing from
//! its peer) AND, while the interface still exists, the floor stays on it.
//! Anything holding `CAP_NET_ADMIN` in that namespace (a VMM run as root
//! there, a network manager) may set the link up again; the guest's frames
//! then still meet the ingress drop, never the kernel's stack. The tables
//! go only with the interface (removal finds it gone) or with the
//! namespace itself; whoever attaches next replaces them with its own
//! floor. The interface is known by its index, recorded at install: a
//! renamed interface is still the floor's, and is kept down and floored.
//! Removal acts only in the namespace the floor was installed in, known by
//! identity (the device and inode of its nsfs file), not by the path,
//! which may since name another.

use std::path::{Path, PathBuf};

use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Table};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use crate::netns::{NsId, run_in_id, run_in_same};
use crate::nft::{self, FloorError};

/// Priority of our chains: before anything else on the same hook.
pub const PRIORITY: i32 = -500;

const WHAT: &str = "ingress floor";

/// The floor on one interface, until [`IngressFloor::remove`] (or drop).
#[derive(Debug)]
pub struct IngressFloor {
    netns: Option<PathBuf>,
    /// The namespace `netns` named when the floor was installed.
    ns_id: Option<NsId>,
    iface: String,
    /// The interface's index in the namespace at install.
    index: u32,
    table: String,
    removed: bool,
}

/// What [`IngressFloor::remove`] left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The interface still exists: it is down, and the floor stays on it
    /// (fail closed) until the interface or the namespace goes.
    Kept,
    /// The interface or the namespace is gone, and so is the floor.
    Removed,
}

/// The table holding the floor for `iface` (one per interface, so floors on
/// two interfaces of one namespace do not collide).
#[must_use]
pub fn table_name(iface: &str) -> String {
    let safe: String = iface
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("sluice_floor_{safe}")
}

fn check_iface(iface: &str) -> Result<(), FloorError> {
    // IFNAMSIZ is 16 with the NUL; the kernel refuses '/', ':' and spaces.
    let ok = !iface.is_empty()
        && iface.len() < 16
        && iface
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(FloorError::Invalid(format!(
            "`{iface}` is not an interface name (1-15 printable characters, no '/' or ':')"
        )))
    }
}

fn objects(iface: &str, table: &str) -> Vec<NfObject<'static>> {
    let t = |family| Table {
        family,
        name: table.to_owned().into(),
        handle: None,
    };
    let add = |o| NfObject::CmdObject(NfCmd::Add(o));
    let del = |o| NfObject::CmdObject(NfCmd::Delete(o));
    vec![
        // Replace any floor of ours left behind: add (a no-op when present),
        // delete, add again, all in one transaction.
        add(NfListObject::Table(t(NfFamily::NetDev))),
        del(NfListObject::Table(t(NfFamily::NetDev))),
        add(NfListObject::Table(t(NfFamily::INet))),
        del(NfListObject::Table(t(NfFamily::INet))),
        add(NfListObject::Table(t(NfFamily::NetDev))),
        add(NfListObject::Chain(Chain {
            family: NfFamily::NetDev,
            table: table.to_owned().into(),
            name: "guest_in".into(),
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Ingress),
            prio: Some(PRIORITY),
            dev: Some(iface.to_owned().into()),
            policy: Some(NfChainPolicy::Drop),
            ..Chain::default()
        })),
        add(NfListObject::Table(t(NfFamily::INet))),
        add(NfListObject::Chain(Chain {
            family: NfFamily::INet,
            table: table.to_owned().into(),
            name: "no_forward".into(),
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Forward),
            prio: Some(PRIORITY),
            policy: Some(NfChainPolicy::Drop),
            ..Chain::default()
        })),
    ]
}

/// The chains of `table` in `family` as nft lists them.
fn chains(family: &'static str, table: &str) -> Result<Vec<Chain<'static>>, FloorError> {
    let listed = nft::list_table(WHAT, family, table)?;
    Ok(listed
        .objects
        .iter()
        .filter_map(|o| match o {
            NfObject::ListObject(NfListObject::Chain(c)) => Some(c.clone()),
            _ => None,
        })
        .collect())
}

fn verify(iface: &str, table: &str) -> Result<(), FloorError> {
    let bad = |detail: String| FloorError::Verify { what: WHAT, detail };
    let ingress = chains("netdev", table)?;
    let hooked = ingress
        .iter()
        .any(|c| c.hook == Some(NfHook::Ingress) && c.policy == Some(NfChainPolicy::Drop));
    // The JSON listing of nft 1.0.6 omits the device; the text names it.
    let text = nft::list_text(WHAT, &["chain", "netdev", table, "guest_in"])?;
    let on_iface = text.contains(&format!("device \"{iface}\""));
    if !(hooked && on_iface) {
        return Err(bad(format!(
            "no ingress drop chain on {iface} in netdev {table}"
        )));
    }
    let forward = chains("inet", table)?;
    if !forward
        .iter()
        .any(|c| c.hook == Some(NfHook::Forward) && c.policy == Some(NfChainPolicy::Drop))
    {
        return Err(bad(format!("no forward drop chain in inet {table}")));
    }
    Ok(())
}

impl IngressFloor {
    /// Installs and verifies the floor on `iface` in the namespace at
    /// `netns` (the caller's when `None`).
    ///
    /// # Errors
    /// `nft` missing or refusing (an interface that does not exist gives
    /// nft's "No such file or directory"), the namespace unusable, or the
    /// rules not what was applied. Nothing is left behind on error.
    pub fn install(netns: Option<&Path>, iface: &str) -> Result<Self, FloorError> {
        check_iface(iface)?;
        let table = table_name(iface);
        let (index, ns_id) = run_in_id(netns, || {
            // nft accepts a netdev chain for a device that does not exist
            // (it binds when one appears): check first.
            let probe = probe_socket()?;
            let Ok(index) = rustix::net::netdevice::name_to_index(&probe, iface) else {
                return Err(FloorError::NoInterface {
                    iface: iface.to_owned(),
                    netns: netns.map_or_else(
                        || "this network namespace".to_owned(),
                        |p| format!("network namespace {}", p.display()),
                    ),
                });
            };
            nft::apply(WHAT, objects(iface, &table))?;
            if let Err(e) = verify(iface, &table) {
                let _ = nft::delete_table(WHAT, NfFamily::NetDev, &table);
                let _ = nft::delete_table(WHAT, NfFamily::INet, &table);
                return Err(e);
            }
            Ok(index)
        })?;
        Ok(Self {
            netns: netns.map(Path::to_owned),
            ns_id,
            iface: iface.to_owned(),
            index,
            table,
            removed: false,
        })
    }

    /// The interface the floor is on.
    #[must_use]
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Whether the floor is still in place as installed.
    ///
    /// # Errors
    /// As for [`Self::install`].
    pub fn check(&self) -> Result<(), FloorError> {
        run_in_same(self.netns.as_deref(), self.ns_id, || {
            verify(&self.iface, &self.table)
        })
    }

    /// Leaves the floor installed and forgets it: for a namespace nobody
    /// names (no `/run/netns` mount), which the kernel frees, with its
    /// rules, when the last descriptor or process holding it is gone. No
    /// removal is attempted then, which could only open the guest to that
    /// namespace's kernel while the VM still runs.
    pub fn keep_with_namespace(mut self) {
        self.removed = true;
    }

    /// The end of the gateway that served the interface (module docs):
    /// sets the interface down and keeps the floor while the interface
    /// exists ([`Ended::Kept`]); deletes the floor when the interface or
    /// the namespace is already gone ([`Ended::Removed`]).
    ///
    /// # Errors
    /// The path now names another namespace than the floor's (nothing is
    /// touched), the interface could not be set down (the rules stay), or
    /// `nft` failed.
    pub fn remove(mut self) -> Result<Ended, FloorError> {
        self.removed = true;
        if let Some(ns) = &self.netns
            && !ns.exists()
        {
            return Ok(Ended::Removed);
        }
        run_in_same(self.netns.as_deref(), self.ns_id, || {
            let probe = probe_socket()?;
            match rustix::net::netdevice::index_to_name(&probe, self.index) {
                // Gone: the guest's link went with it, the floor may go.
                Err(rustix::io::Errno::NODEV) => {
                    self.delete_tables()?;
                    Ok(Ended::Removed)
                }
                Err(e) => Err(FloorError::LinkDown {
                    iface: self.iface.clone(),
                    message: format!("looking up interface index {}: {e}", self.index),
                }),
                // Possibly renamed since: still the floor's interface.
                Ok(name) => {
                    cut_link(&name)?;
                    Ok(Ended::Kept)
                }
            }
        })
    }

    fn delete_tables(&self) -> Result<(), FloorError> {
        nft::delete_table(WHAT, NfFamily::NetDev, &self.table)?;
        nft::delete_table(WHAT, NfFamily::INet, &self.table)
    }

    /// A floor that never served (a failure before the gateway set the
    /// interface up): the interface is set down and the floor removed, so
    /// a refused attach leaves nothing behind.
    fn discard(&self) -> Result<(), FloorError> {
        if let Some(ns) = &self.netns
            && !ns.exists()
        {
            return Ok(());
        }
        run_in_same(self.netns.as_deref(), self.ns_id, || {
            let probe = probe_socket()?;
            if let Ok(name) = rustix::net::netdevice::index_to_name(&probe, self.index) {
                cut_link(&name)?;
            }
            self.delete_tables()
        })
    }
}

/// A socket for interface ioctls in the calling thread's namespace (never
/// inherited by the `nft` or `ip` this crate runs).
fn probe_socket() -> Result<rustix::fd::OwnedFd, FloorError> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| FloorError::Invalid(format!("cannot open a probe socket: {e}")))
}

/// Where `ip` is looked for (absolute paths only: a caller's `PATH` is not
/// trusted to name it, and may be empty).
const IP_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Sets `iface` (in the calling thread's namespace) down with iproute2's
/// `ip`. An interface that vanished since its name was looked up is an
/// error: the caller keeps the floor (fail closed).
fn cut_link(iface: &str) -> Result<(), FloorError> {
    let failed = |message: String| FloorError::LinkDown {
        iface: iface.to_owned(),
        message,
    };
    let ip = IP_DIRS
        .iter()
        .map(|d| Path::new(d).join("ip"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            failed(format!(
                "`ip` (iproute2) not found in {}",
                IP_DIRS.join(", ")
            ))
        })?;
    let out = std::process::Command::new(&ip)
        .args(["link", "set", "dev", iface, "down"])
        .stdin(std::process::Stdio::null())
        .env_clear()
        .output()
        .map_err(|e| failed(format!("running {}: {e}", ip.display())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(failed(nft::one_line(&String::from_utf8_lossy(&out.stderr))))
}

impl Drop for IngressFloor {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.discard();
        }
    }
}

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
//! namespace itself.
//!
//! Ownership: each floor's tables carry a name of its own instance
//! ([`table_prefix`] then the installer's pid and install time), so a
//! gateway attaching after another to the same interface, or to a new
//! interface of the same name, installs its own tables beside any left
//! behind, and the earlier one's removal deletes only its own. The
//! interface is known by its index, recorded at install: a renamed
//! interface is still the floor's, and is kept down and floored. The
//! namespace is known by the descriptor opened at install, never by its
//! path again.
//!
//! Leftovers: a floor kept by a normal end stays while its interface
//! exists; when the interface goes after its gateway (and keeper) ended,
//! nobody is left to delete the two tables, and they stay, harmless (the
//! ingress chain hooks nothing; a kernel older than 6.16 deletes that
//! chain with its device and leaves an empty netdev table), until the
//! namespace goes or the next floor is installed there, which deletes
//! such orphans ([`IngressFloor::install_in`]).
//!
//! Bypasses: nftables runs every base chain on a hook in priority order,
//! so a chain of someone else's on the interface's ingress before the
//! floor's (a `fwd` or `dup` statement there) would carry the guest's
//! frames past it, as would a flowtable taking the interface. Install
//! refuses them ([`Foreign::Refuse`]) and [`IngressFloor::check`] looks
//! again.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Table};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use crate::link;
use crate::netns;
use crate::nft::{self, FloorError};
use crate::ruleset::{self, Devices, Ruleset};

/// Priority of our chains: before anything else on the same hook.
pub const PRIORITY: i32 = -500;

/// Every floor table's name starts so (then the interface, then the
/// instance: [`table_prefix`]).
pub const TABLE_PREFIX: &str = "sluice_floor_";

const WHAT: &str = "ingress floor";

/// The floor's two chains.
const INGRESS_CHAIN: &str = "guest_in";
const FORWARD_CHAIN: &str = "no_forward";

/// Whether a foreign chain or flowtable that sees the interface's frames
/// before the floor's drop is refused ([`IngressFloor::install_in`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// Refused at install, and a reason for [`IngressFloor::check`] to fail.
    Refuse,
    /// Tolerated (`--allow-missing-isolation nftables`).
    Allow,
}

/// The floor on one interface, until [`IngressFloor::remove`] (or drop).
#[derive(Debug)]
pub struct IngressFloor {
    /// The namespace the floor is in (`None`: the caller's), held open:
    /// every later step enters it by this descriptor, never by a path.
    ns: Option<OwnedFd>,
    /// What names the namespace in messages.
    label: PathBuf,
    iface: String,
    /// The interface's index in the namespace at install: the interface
    /// is found by it (a renamed one is still the floor's).
    index: u32,
    /// This instance's table name (in both families).
    table: String,
    foreign: Foreign,
    removed: bool,
    /// Says the interface is gone by something other than its index
    /// ([`IngressFloor::know_gone_by`]).
    gone: Option<GoneCheck>,
}

/// A caller's way of telling that the floor's interface is gone without
/// its index, which the kernel may give to another interface as soon as
/// it is (one moved into the namespace keeps its index when free, `ip
/// link add … index N` asks for one).
struct GoneCheck(Box<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for GoneCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GoneCheck")
    }
}

/// What [`IngressFloor::remove`] left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The interface still exists: it is down, and the floor stays on it
    /// (fail closed) until the interface or the namespace goes.
    Kept,
    /// The interface is gone, and so is the floor.
    Removed,
}

/// The start of the name of every floor table on `iface`.
#[must_use]
pub fn table_prefix(iface: &str) -> String {
    let safe: String = iface
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{TABLE_PREFIX}{safe}_")
}

/// A table name of this floor instance's own: two gateways attaching one
/// after the other to the same interface (or to a new interface of the
/// same name) never share, replace or delete each other's tables.
fn instance_table(iface: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}{:x}_{nanos:x}", table_prefix(iface), std::process::id())
}

/// Whether `iface` is a name the floor takes: the kernel's own rules
/// (`dev_valid_name`: 1 to 15 bytes, not `.` or `..`) and only letters,
/// digits and `_ . @ -`. The kernel also allows `*`, braces, `;`, `,`,
/// `#`, quotes and backslashes, which nft reads otherwise: a netdev chain
/// hooked on `tap*` takes every interface whose name starts `tap` (kernel
/// 6.16 and later), and a floor so hooked would drop them all, and stay.
fn check_iface(iface: &str) -> Result<(), FloorError> {
    // IFNAMSIZ is 16 with the NUL.
    let ok = !iface.is_empty()
        && iface.len() < 16
        && iface != "."
        && iface != ".."
        && iface
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.@-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(FloorError::Invalid(format!(
            "`{}` is not an interface name the floor takes (1-15 characters of A-Z a-z 0-9 _ . @ -, not `.` or `..`)",
            iface.escape_debug()
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
        // Replace this instance's floor as it may have been left (altered,
        // or on the interface's old name): add (a no-op when present),
        // delete, add again, all in one transaction.
        add(NfListObject::Table(t(NfFamily::NetDev))),
        del(NfListObject::Table(t(NfFamily::NetDev))),
        add(NfListObject::Table(t(NfFamily::INet))),
        del(NfListObject::Table(t(NfFamily::INet))),
        add(NfListObject::Table(t(NfFamily::NetDev))),
        add(NfListObject::Chain(Chain {
            family: NfFamily::NetDev,
            table: table.to_owned().into(),
            name: INGRESS_CHAIN.into(),
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
            name: FORWARD_CHAIN.into(),
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Forward),
            prio: Some(PRIORITY),
            policy: Some(NfChainPolicy::Drop),
            ..Chain::default()
        })),
    ]
}

/// The namespace's ruleset (in the calling thread's namespace), from
/// its JSON listing ([`ruleset`] module docs).
/// `table` names the floor whose tables' flags are read.
fn ruleset(table: &str) -> Result<Ruleset, FloorError> {
    let ours = [("netdev", table), ("inet", table)];
    ruleset::read(WHAT, &|args| nft::output(WHAT, args), &ours, TABLE_PREFIX)
}

/// `devices` for a message.
fn shown(devices: &Devices) -> String {
    match devices {
        Devices::Known(names) => format!("{names:?}"),
        Devices::Unreadable(why) => format!("unreadable: {why}"),
    }
}

/// Whether `table`'s floor is in `rules` as installed, on `iface`: both
/// tables there without flags (`dormant` unhooks every chain of a table
/// and leaves them listed as they were), the ingress drop chain on it and
/// the forward drop chain, neither with a rule (one `accept` would open
/// it).
fn verify(rules: &Ruleset, iface: &str, table: &str) -> Result<(), FloorError> {
    let bad = |detail: String| FloorError::Verify { what: WHAT, detail };
    for family in ["netdev", "inet"] {
        match rules.table(family, table) {
            None => return Err(bad(format!("no table {family} {table}"))),
            Some(t) => {
                if let Some(flags) = &t.flags {
                    return Err(bad(format!(
                        "table {family} {table} carries flags ({flags}): a dormant table's chains are unhooked"
                    )));
                }
            }
        }
    }
    let ours = |family: &str, name: &str| {
        rules
            .chains
            .iter()
            .find(|c| c.family == family && c.table == table && c.name == name)
    };
    match ours("netdev", INGRESS_CHAIN) {
        Some(c)
            if c.hook == "ingress"
                && c.devices == Devices::Known(vec![iface.to_owned()])
                && c.policy_drop
                && !c.has_rules
                && c.priority == Some(PRIORITY) => {}
        Some(c) => {
            return Err(bad(format!(
                "netdev {table} {INGRESS_CHAIN} is not a bare drop on {iface} (hook {}, devices {}, priority {:?}, drop {}, rules {})",
                c.hook,
                shown(&c.devices),
                c.priority,
                c.policy_drop,
                c.has_rules
            )));
        }
        None => {
            return Err(bad(format!(
                "no ingress drop chain netdev {table} on {iface}"
            )));
        }
    }
    match ours("inet", FORWARD_CHAIN) {
        Some(c) if c.hook == "forward" && c.policy_drop && !c.has_rules => Ok(()),
        _ => Err(bad(format!("no bare forward drop chain in inet {table}"))),
    }
}

/// What in `rules`, besides `table`'s own two chains, sees `iface`'s
/// frames before the floor's drop or the gateway's frames on their way
/// to the guest, if anything: an ingress chain on it at the floor's
/// priority or before (it could `fwd` or `dup` them elsewhere), any
/// egress chain on it, any flowtable taking it. Another floor (a table of
/// ours left by an earlier gateway: a bare drop chain) is no bypass.
fn foreign_bypass(rules: &Ruleset, iface: &str, table: &str) -> Option<String> {
    for c in &rules.chains {
        let own = c.table == table && (c.name == INGRESS_CHAIN || c.name == FORWARD_CHAIN);
        if own || !c.on(iface) {
            continue;
        }
        let another_floor = c.table.starts_with(TABLE_PREFIX)
            && c.name == INGRESS_CHAIN
            && c.hook == "ingress"
            && c.policy_drop
            && !c.has_rules;
        if another_floor {
            continue;
        }
        let mut at = c.priority.map_or_else(
            || "an unreadable priority".to_owned(),
            |p| format!("priority {p}"),
        );
        if let Devices::Unreadable(why) = &c.devices {
            at.push_str(&format!(", its devices unreadable ({why})"));
        }
        match c.hook.as_str() {
            "ingress" if c.priority.is_none_or(|p| p <= PRIORITY) => {
                return Some(format!(
                    "an nftables ingress chain `{} {} {}` at {at} (the floor's is {PRIORITY})",
                    c.family, c.table, c.name
                ));
            }
            "egress" => {
                return Some(format!(
                    "an nftables egress chain `{} {} {}` at {at}",
                    c.family, c.table, c.name
                ));
            }
            _ => {}
        }
    }
    rules.flowtables.iter().find(|f| f.on(iface)).map(|f| {
        format!(
            "an nftables flowtable `{} {} {}` (devices {})",
            f.family,
            f.table,
            f.name,
            shown(&f.devices)
        )
    })
}

/// Whether `name` is a floor instance's table name as [`instance_table`]
/// makes them: the prefix, the interface's name made safe, the pid and
/// the install time in hex.
fn instance_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TABLE_PREFIX) else {
        return false;
    };
    let mut parts = rest.rsplitn(3, '_');
    let hex = |p: Option<&str>| {
        p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    hex(parts.next())
        && hex(parts.next())
        && parts.next().is_some_and(|p| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// The floor tables of earlier instances that guard no interface any
/// more, in `rules` and `tables` (every table of the namespace): a name
/// of an instance's making, no regular chain, an inet table holding the
/// bare forward drop and nothing else (or nothing), and a netdev table
/// either holding one bare ingress drop hooked on device names none of
/// which exists now (looked up with `probe`, in the calling thread's
/// namespace: a kernel of 6.16 or later keeps the chain when its device
/// goes) or holding no chain at all (an older kernel deletes a netdev
/// chain with its only device; the inet table must then hold the forward
/// drop). What a TAP deleted after its gateway ended leaves behind;
/// deleting it opens nothing, as it drops nothing of any interface's. A
/// table altered by anyone, or hooked on a wildcard, is left alone.
fn orphans(
    rules: &Ruleset,
    tables: &[(String, String)],
    own: &str,
    probe: &OwnedFd,
) -> Vec<String> {
    use std::collections::BTreeSet;
    let names: BTreeSet<&str> = tables
        .iter()
        .map(|(_, name)| name.as_str())
        .chain(rules.chains.iter().map(|c| c.table.as_str()))
        .filter(|name| *name != own && instance_name(name))
        .collect();
    let gone = |devices: &Devices| match devices {
        Devices::Known(names) => {
            !names.is_empty()
                && names.iter().all(|d| {
                    !d.ends_with('*') && rustix::net::netdevice::name_to_index(probe, d).is_err()
                })
        }
        Devices::Unreadable(_) => false,
    };
    names
        .into_iter()
        .filter(|name| {
            if rules.regular.iter().any(|(_, t, _)| t == name) {
                return false;
            }
            let chains: Vec<&ruleset::BaseChain> =
                rules.chains.iter().filter(|c| c.table == *name).collect();
            let bare = |c: &&ruleset::BaseChain| c.policy_drop && !c.has_rules;
            let of = |family: &str| -> Vec<&ruleset::BaseChain> {
                chains
                    .iter()
                    .copied()
                    .filter(|c| c.family == family)
                    .collect()
            };
            let (netdev, inet) = (of("netdev"), of("inet"));
            if netdev.len() + inet.len() != chains.len() {
                return false;
            }
            let forward_only = inet
                .iter()
                .all(|c| c.name == FORWARD_CHAIN && c.hook == "forward" && bare(c));
            match netdev.as_slice() {
                [c] => {
                    forward_only
                        && c.name == INGRESS_CHAIN
                        && c.hook == "ingress"
                        && bare(c)
                        && gone(&c.devices)
                }
                [] => {
                    forward_only
                        && inet.len() == 1
                        && tables.iter().any(|(f, t)| f == "netdev" && t == name)
                }
                _ => false,
            }
        })
        .map(str::to_owned)
        .collect()
}

impl IngressFloor {
    /// Installs and verifies the floor on `iface` in the namespace at
    /// `netns` (the caller's when `None`). The path is opened once; the
    /// floor keeps that descriptor and never opens the path again.
    ///
    /// # Errors
    /// As for [`Self::install_in`], and a path that cannot be opened.
    pub fn install(
        netns: Option<&Path>,
        iface: &str,
        foreign: Foreign,
    ) -> Result<Self, FloorError> {
        match netns {
            Some(path) => {
                let ns = netns::open(path)?;
                Self::install_in(Some(ns.as_fd()), path, iface, foreign)
            }
            None => Self::install_in(None, Path::new("(this network namespace)"), iface, foreign),
        }
    }

    /// Installs and verifies the floor on `iface` in the namespace `ns`
    /// (the caller's when `None`; `label` names it in messages). The floor
    /// keeps a duplicate of `ns` (close-on-exec; [`Self::netns_fd`]): its
    /// checks and its removal enter that namespace and no other, and keep
    /// it alive while the floor lives. With [`Foreign::Refuse`], a chain
    /// or flowtable of someone else's that sees `iface`'s frames before
    /// the floor's drop is refused. Once its own floor holds, it deletes
    /// the tables of earlier floors whose interface is gone (what a TAP
    /// deleted after its gateway ended leaves, since no keeper is left to
    /// see it go), and no other.
    ///
    /// # Errors
    /// `nft` missing or refusing, the interface missing, a foreign bypass,
    /// the namespace unusable, or the rules not what was applied. Nothing
    /// is left behind on error.
    pub fn install_in(
        ns: Option<BorrowedFd<'_>>,
        label: &Path,
        iface: &str,
        foreign: Foreign,
    ) -> Result<Self, FloorError> {
        check_iface(iface)?;
        let ns = ns
            .map(|fd| fd.try_clone_to_owned())
            .transpose()
            .map_err(|e| netns::netns_err(label, format!("duplicating its descriptor: {e}")))?;
        let table = instance_table(iface);
        let index = netns::run_in(ns.as_ref().map(AsFd::as_fd), label, || {
            // nft accepts a netdev chain for a device that does not exist
            // (it binds when one appears): check first.
            let probe = probe_socket()?;
            let Ok(index) = rustix::net::netdevice::name_to_index(&probe, iface) else {
                return Err(FloorError::NoInterface {
                    iface: iface.to_owned(),
                    netns: format!("network namespace {}", label.display()),
                });
            };
            if foreign == Foreign::Refuse
                && let Some(what) = foreign_bypass(&ruleset(&table)?, iface, &table)
            {
                return Err(FloorError::Bypass {
                    iface: iface.to_owned(),
                    what,
                });
            }
            nft::apply(WHAT, objects(iface, &table))?;
            let rules = match ruleset(&table).and_then(|r| verify(&r, iface, &table).map(|()| r)) {
                Ok(rules) => rules,
                Err(e) => {
                    let _ = delete_tables(&table);
                    return Err(e);
                }
            };
            // Best effort: a leftover that stays is harmless (module docs).
            let tables = ruleset::tables(&|args| nft::output(WHAT, args)).unwrap_or_default();
            for orphan in orphans(&rules, &tables, &table, &probe) {
                let _ = delete_tables(&orphan);
            }
            Ok(index)
        })?;
        Ok(Self {
            ns,
            label: label.to_owned(),
            iface: iface.to_owned(),
            index,
            table,
            foreign,
            removed: false,
            gone: None,
        })
    }

    /// The interface the floor was installed on (by this name).
    #[must_use]
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// This floor's table (the same name in the netdev and inet families).
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The floor's own descriptor of its namespace (`None`: the caller's),
    /// for a caller that closes descriptors wholesale and must keep it.
    #[must_use]
    pub fn netns_fd(&self) -> Option<BorrowedFd<'_>> {
        self.ns.as_ref().map(AsFd::as_fd)
    }

    /// Has the floor ask `gone` before it acts on its interface's index
    /// (checks, [`Self::restore`], [`Self::remove`]): `true` means the
    /// interface the floor was installed on is gone, whatever interface
    /// holds its index now, which is then left alone. The gateway's is a
    /// packet socket bound to the interface at attach, which the kernel
    /// unbinds when the interface goes.
    #[must_use]
    pub fn know_gone_by(mut self, gone: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.gone = Some(GoneCheck(Box::new(gone)));
        self
    }

    /// The floor's interface's current name (in the calling thread's
    /// namespace), or `NODEV` when it is gone.
    fn current_name(&self, probe: &OwnedFd) -> rustix::io::Result<String> {
        if self.gone.as_ref().is_some_and(|g| (g.0)()) {
            return Err(rustix::io::Errno::NODEV);
        }
        rustix::net::netdevice::index_to_name(probe, self.index)
    }

    fn run_in<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, FloorError> + Send,
    ) -> Result<T, FloorError> {
        netns::run_in(self.netns_fd(), &self.label, f)
    }

    /// Whether the floor is still in place as installed: the interface
    /// (found by its index) still has the name the floor's chain is hooked
    /// on (the kernel unhooks a netdev chain from an interface renamed
    /// away from it), both tables are there and not dormant, both chains
    /// unaltered and, unless [`Foreign::Allow`], nothing of someone else's
    /// in nftables sees the interface's frames before the floor. A
    /// failure that may pass on its own ([`FloorError::is_transient`]: a
    /// failed `nft` run, a ruleset that changed while it was read) is
    /// asked again, [`CHECK_TRIES`] times in all, before it is returned.
    ///
    /// # Errors
    /// [`FloorError::NoInterface`] when the interface is gone (nothing to
    /// protect any more); [`FloorError::Verify`] or
    /// [`FloorError::Bypass`] when the floor no longer holds; `nft`
    /// errors that persisted.
    pub fn check(&self) -> Result<(), FloorError> {
        self.check_with(|_, _| Ok(None))
    }

    /// [`Self::check`], and then `also` in the floor's namespace with the
    /// interface's current name and its index: what sees its frames
    /// outside nftables (tc, XDP, tcx: the caller's tools), if anything
    /// (`Ok(Some(what))`: [`FloorError::Bypass`]), or why that could not
    /// be looked at (`Err`: [`FloorError::Probe`], transient).
    ///
    /// # Errors
    /// As for [`Self::check`], and those two.
    pub fn check_with<F>(&self, also: F) -> Result<(), FloorError>
    where
        F: Fn(&str, u32) -> Result<Option<String>, String> + Sync,
    {
        settle(CHECK_TRIES, CHECK_PAUSE, || self.check_once(&also))
    }

    fn check_once<F>(&self, also: &F) -> Result<(), FloorError>
    where
        F: Fn(&str, u32) -> Result<Option<String>, String> + Sync,
    {
        self.run_in(|| {
            let probe = probe_socket()?;
            let name = match self.current_name(&probe) {
                Ok(name) => name,
                Err(rustix::io::Errno::NODEV) => {
                    return Err(FloorError::NoInterface {
                        iface: self.iface.clone(),
                        netns: format!("network namespace {}", self.label.display()),
                    });
                }
                Err(e) => return Err(FloorError::Invalid(format!(
                    "looking up interface index {}: {e}",
                    self.index
                ))),
            };
            if name != self.iface {
                return Err(FloorError::Verify {
                    what: WHAT,
                    detail: format!(
                        "`{}` was renamed to `{name}`, and the kernel unhooks the floor's chain from it",
                        self.iface
                    ),
                });
            }
            let rules = ruleset(&self.table)?;
            verify(&rules, &self.iface, &self.table)?;
            if self.foreign == Foreign::Refuse
                && let Some(what) = foreign_bypass(&rules, &self.iface, &self.table)
            {
                return Err(FloorError::Bypass {
                    iface: self.iface.clone(),
                    what,
                });
            }
            match also(&name, self.index) {
                Ok(None) => Ok(()),
                Ok(Some(what)) => Err(FloorError::Bypass { iface: name, what }),
                Err(message) => Err(FloorError::Probe {
                    iface: name,
                    message,
                }),
            }
        })
    }

    /// Puts the floor back as installed, now, without ending it: sets the
    /// interface (found by its index) down and applies the floor again on
    /// its current name, then verifies it ([`Self::remove`]'s steps for an
    /// interface that exists). For a keeper that found the floor no longer
    /// holding while the gateway serves: the guest's frames meet the drop
    /// again at once, whatever the gateway's end takes, and even if the
    /// interface is set up again meanwhile. An interface that is gone
    /// needs nothing.
    ///
    /// # Errors
    /// As for [`Self::remove`]; the floor is put back even when the
    /// interface could not be set down, and the error then says both.
    pub fn restore(&self) -> Result<(), FloorError> {
        self.run_in(|| {
            let probe = probe_socket()?;
            match self.current_name(&probe) {
                Ok(name) => self.keep_on(&name),
                Err(rustix::io::Errno::NODEV) => Ok(()),
                Err(e) => Err(self.lookup_failed(&e)),
            }
        })
    }

    /// The interface's index could not be looked up (not because it is
    /// gone): nothing was done to it or to the floor.
    fn lookup_failed(&self, e: &rustix::io::Errno) -> FloorError {
        FloorError::LinkDown {
            iface: self.iface.clone(),
            message: format!("looking up interface index {}: {e}", self.index),
            floor: "its floor is as it was".to_owned(),
        }
    }

    /// Sets the interface (in the calling thread's namespace, named
    /// `name` now) down by its index and applies and verifies the floor
    /// on `name`, the floor whatever the cut's outcome: a link left up is
    /// no reason to leave it without its floor. Both results are in the
    /// error.
    ///
    /// A name nft could read as more than this interface (renamed to
    /// `tap*`: a wildcard) is never hooked: the link is set down and the
    /// tables are left as they were ([`FloorError::UnsafeName`]).
    fn keep_on(&self, name: &str) -> Result<(), FloorError> {
        let cut = link::set_down(self.index);
        if check_iface(name).is_err() {
            return Err(FloorError::UnsafeName {
                name: name.to_owned(),
                cut: match cut {
                    Ok(()) => "it was set down".to_owned(),
                    Err(e) => format!("it could not be set down ({e})"),
                },
            });
        }
        let floor = nft::apply(WHAT, objects(name, &self.table))
            .and_then(|()| verify(&ruleset(&self.table)?, name, &self.table));
        both(name, cut, floor)
    }

    /// Leaves the floor installed and forgets it: for a namespace nobody
    /// names (no `/run/netns` mount), which the kernel frees, with its
    /// rules, when the last descriptor or process holding it is gone. No
    /// removal is attempted then, which could only open the guest to that
    /// namespace's kernel while the VM still runs.
    pub fn keep_with_namespace(self) {
        self.hand_over();
    }

    /// Forgets the floor, leaving it installed and closing this copy of
    /// its namespace's descriptor: for a process whose copy of the floor
    /// another process now owns (the gateway after forking the keeper).
    pub fn hand_over(mut self) {
        self.removed = true;
    }

    /// The end of the gateway that served the interface (module docs):
    /// sets the interface down and keeps the floor on it while it exists
    /// ([`Ended::Kept`]: put back as installed, on the interface's current
    /// name, whatever was done to it meanwhile); deletes this floor's own
    /// tables, and no one else's, when the interface is already gone
    /// ([`Ended::Removed`]). All in the floor's namespace, entered by its
    /// descriptor, whatever its path names now.
    ///
    /// # Errors
    /// The interface could not be set down ([`FloorError::LinkDown`],
    /// which says whether its floor was put back all the same: it is
    /// tried whatever the cut's outcome) or its floor put back (what is
    /// there stays), or `nft` failed.
    pub fn remove(self) -> Result<Ended, FloorError> {
        self.remove_with(|_, _| Ok(None))
    }

    /// [`Self::remove`], and then, when the floor is kept, what still
    /// sees the interface's frames outside it: unless [`Foreign::Allow`]
    /// a foreign chain ahead of it, and `also` as for
    /// [`Self::check_with`] (tc, XDP, tcx). A bypass the link being down
    /// is all that holds is not an end to report as fail closed.
    ///
    /// # Errors
    /// As for [`Self::remove`], and [`FloorError::Outranked`] when the
    /// floor is kept but something still sees the interface's frames
    /// outside it (or could not be looked for).
    pub fn remove_with<F>(mut self, also: F) -> Result<Ended, FloorError>
    where
        F: Fn(&str, u32) -> Result<Option<String>, String> + Sync,
    {
        self.removed = true;
        let ended = self.end()?;
        if ended == Ended::Kept {
            self.run_in(|| {
                let probe = probe_socket()?;
                let Ok(name) = self.current_name(&probe) else {
                    return Ok(());
                };
                let outranked = |what: String| FloorError::Outranked {
                    iface: name.clone(),
                    what,
                };
                if self.foreign == Foreign::Refuse
                    && let Some(what) = foreign_bypass(&ruleset(&self.table)?, &name, &self.table)
                {
                    return Err(outranked(what));
                }
                match also(&name, self.index) {
                    Ok(None) => Ok(()),
                    Ok(Some(what)) => Err(outranked(what)),
                    Err(e) => Err(outranked(format!(
                        "something that could not be looked for ({e})"
                    ))),
                }
            })?;
        }
        Ok(ended)
    }

    /// [`Self::remove`]'s steps.
    fn end(&self) -> Result<Ended, FloorError> {
        self.run_in(|| {
            let probe = probe_socket()?;
            match self.current_name(&probe) {
                // Gone: the guest's link went with it, the floor may go.
                Err(rustix::io::Errno::NODEV) => {
                    delete_tables(&self.table)?;
                    Ok(Ended::Removed)
                }
                Err(e) => Err(self.lookup_failed(&e)),
                // Possibly renamed since: still the floor's interface.
                Ok(name) => self.keep_on(&name).map(|()| Ended::Kept),
            }
        })
    }

    /// A floor that never served (a failure before the gateway set the
    /// interface up): the interface is set down and the floor removed, so
    /// a refused attach leaves nothing behind. An interface that could not
    /// be set down keeps its floor, put back as installed.
    fn discard(&self) -> Result<(), FloorError> {
        self.run_in(|| {
            let probe = probe_socket()?;
            if let Ok(name) = self.current_name(&probe)
                && link::set_down(self.index).is_err()
            {
                return self.keep_on(&name);
            }
            delete_tables(&self.table)
        })
    }
}

/// The outcome of setting `name` down (`cut`) and of putting its floor
/// back (`floor`), both done whatever the other gave: the floor's error
/// when only it failed, else [`FloorError::LinkDown`] saying what became
/// of the floor.
fn both(
    name: &str,
    cut: Result<(), String>,
    floor: Result<(), FloorError>,
) -> Result<(), FloorError> {
    let floor = match (&cut, floor) {
        (Ok(()), floor) => return floor,
        (Err(_), Ok(())) => "its floor is back on it".to_owned(),
        (Err(_), Err(e)) => format!("putting its floor back failed too: {e}"),
    };
    Err(FloorError::LinkDown {
        iface: name.to_owned(),
        message: cut.err().unwrap_or_default(),
        floor,
    })
}

/// How many times in a row [`IngressFloor::check`] asks before a
/// transient failure is taken as the answer.
pub const CHECK_TRIES: u32 = 3;

/// The pause between two of those.
const CHECK_PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

/// Runs `check` until it passes, fails for a reason that is not transient
/// ([`FloorError::is_transient`]), or has failed `tries` times in a row
/// (pausing `pause` between tries): one failed `nft` run in a busy
/// namespace is not a floor that stopped holding.
fn settle(
    tries: u32,
    pause: std::time::Duration,
    mut check: impl FnMut() -> Result<(), FloorError>,
) -> Result<(), FloorError> {
    let mut tried = 1;
    loop {
        match check() {
            Err(e) if e.is_transient() && tried < tries => {
                tried += 1;
                std::thread::sleep(pause);
            }
            done => return done,
        }
    }
}

/// Deletes the floor table `table` of both families (in the calling
/// thread's namespace).
fn delete_tables(table: &str) -> Result<(), FloorError> {
    nft::delete_table(WHAT, NfFamily::NetDev, table)?;
    nft::delete_table(WHAT, NfFamily::INet, table)
}

/// A socket for interface ioctls in the calling thread's namespace (never
/// inherited by the `nft` this crate runs).
fn probe_socket() -> Result<OwnedFd, FloorError> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| FloorError::Invalid(format!("cannot open a probe socket: {e}")))
}

impl Drop for IngressFloor {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.discard();
        }
    }
}

#[cfg(test)]
mod tests;

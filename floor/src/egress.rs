//! The egress floor: the gateway's own packets (matched by its uid or,
//! under `sluice run`, by a gid of its own) never reach loopback,
//! link-local, the host's addresses or non-public ranges, except what the
//! policy names and its DNS resolvers on port 53.
//!
//! Rules, in order, all matching the owner first:
//! 1. replies from the ports the gateway listens on (published ports, a
//!    TCP metrics listener) on connections others opened to it: accept;
//! 2. each resolver, UDP and TCP to its port (53): accept;
//! 3. any address the kernel routes as local, broadcast or multicast
//!    (`fib daddr type`, judged per packet, so an address added after
//!    start is covered too), each `deny_first` network (the classes no
//!    policy opens: [`always_denied`], the host's addresses, cloud host
//!    services): drop;
//! 4. each `allow` network (what the policy names): accept;
//! 5. each `deny` network ([`non_public`]): drop.
//!
//! The chain hooks output at [`PRIORITY`], after conntrack (so a reply is
//! known as one) and after output DNAT (so the floor judges the address a
//! packet will really go to).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use nftables::expr::{
    CT, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression, Payload, PayloadField,
    Prefix,
};
use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Rule, Table};
use nftables::stmt::{self, Accept, Counter, Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use crate::netns::run_in_path as run_in;
use crate::nft::{self, FloorError};

const WHAT: &str = "egress floor";

/// The output hook priority of the floor's chain: after conntrack (-200),
/// so `ct direction` is known, and after output DNAT (-100), so a rule
/// sees the destination the packet will be routed to.
pub const PRIORITY: i32 = 0;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().filter_map(|s| s.parse().ok()).collect()
}

/// Destinations no policy can open (the classes
/// `sluice_policy::platform::AddressClass::is_always_denied` names, but
/// cloud host services, which the caller adds): loopback, unspecified,
/// link-local (metadata services), multicast and the limited broadcast.
/// Dropped before the policy's networks are consulted, so a broad `cidr:`
/// rule can never open them.
#[must_use]
pub fn always_denied() -> Vec<IpNet> {
    nets(&[
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "255.255.255.255/32",
        "::/128",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
    ])
}

/// Non-public destinations a policy may open by naming them (`internal:`,
/// `cidr:`): the RFC 1918, CGNAT, benchmarking, documentation, site-local
/// and ULA ranges, Teredo and the reserved blocks, and the IPv6 forms that
/// carry an IPv4 address the host may translate (NAT64 `64:ff9b::/96` and
/// `64:ff9b:1::/48`, 6to4 `2002::/16`). Together with [`always_denied`],
/// every network `sluice_policy::platform::classify` calls non-public.
#[must_use]
pub fn non_public() -> Vec<IpNet> {
    nets(&[
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "192.88.99.0/24",
        "240.0.0.0/4",
        "fec0::/10",
        "fc00::/7",
        "2001::/32",
        "2001:db8::/32",
        "2001:2::/48",
        "3fff::/20",
        "100::/64",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
    ])
}

/// The address types the kernel's routing table gives a destination that
/// the floor drops whatever the policy names (`fib daddr type`).
const LOCAL_TYPES: [&str; 3] = ["local", "broadcast", "multicast"];

/// Whose packets the floor matches (the socket's owner, `meta skuid` /
/// `meta skgid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Every socket of this uid.
    Uid(u32),
    /// Every socket of this gid: `sluice run` gives each gateway a gid no
    /// other process has, so concurrent gateways get floors of their own.
    Gid(u32),
}

impl Owner {
    fn table(self) -> String {
        match self {
            Self::Uid(u) => format!("sluice_egress_{u}"),
            Self::Gid(g) => format!("sluice_egress_gid_{g}"),
        }
    }
}

/// What the egress floor holds the gateway to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSpec {
    /// Whose packets are matched.
    pub owner: Owner,
    /// The local ports the gateway listens on (published ports, a TCP
    /// metrics listener): its replies from them, on connections others
    /// opened, are accepted whatever their destination. Nothing else the
    /// gateway sends counts as a reply.
    pub reply_ports: Vec<u16>,
    /// The resolvers the gateway forwards DNS to: each accepted on its own
    /// port (UDP and TCP) only, before anything is dropped (a resolver is
    /// often on a private address).
    pub resolvers: Vec<SocketAddr>,
    /// Addresses accepted for TCP on their port only, before anything is
    /// dropped (the approval webhook: HTTP, never UDP).
    pub tcp_only: Vec<SocketAddr>,
    /// Dropped before `allow` is consulted: [`always_denied`], the host's
    /// own addresses and cloud host services, which no policy network
    /// opens. Addresses the kernel routes as local are dropped here too,
    /// without being listed.
    pub deny_first: Vec<IpNet>,
    /// Destinations inside `deny` the policy names (`internal`, `cidr`).
    pub allow: Vec<IpNet>,
    /// Destinations dropped unless `allow` named them ([`non_public`]).
    pub deny: Vec<IpNet>,
}

impl EgressSpec {
    fn rules(&self) -> usize {
        self.reply_ports.len()
            + 2 * self.resolvers.len()
            + self.tcp_only.len()
            + LOCAL_TYPES.len()
            + self.deny_first.len()
            + self.allow.len()
            + self.deny.len()
    }
}

/// The floor for one uid, until [`EgressFloor::remove`] (or drop).
#[derive(Debug)]
pub struct EgressFloor {
    netns: Option<PathBuf>,
    table: String,
    rules: usize,
    removed: bool,
}

fn cow(s: &str) -> Cow<'static, str> {
    Cow::Owned(s.to_owned())
}

fn owner_is(owner: Owner) -> Statement<'static> {
    let (key, id) = match owner {
        Owner::Uid(u) => (MetaKey::Skuid, u),
        Owner::Gid(g) => (MetaKey::Skgid, g),
    };
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Meta(Meta { key })),
        right: Expression::Number(id),
        op: Operator::EQ,
    })
}

fn port_is(protocol: &str, field: &str, port: u32) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: cow(protocol),
                field: cow(field),
            },
        ))),
        right: Expression::Number(port),
        op: Operator::EQ,
    })
}

fn drop_counted() -> [Statement<'static>; 2] {
    [
        Statement::Counter(Counter::Anonymous(None)),
        Statement::Drop(Some(stmt::Drop {})),
    ]
}

fn daddr_in(net: &IpNet) -> Statement<'static> {
    let protocol = match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    };
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: cow(protocol),
                field: cow("daddr"),
            },
        ))),
        right: Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(Expression::String(cow(&net.network().to_string()))),
            len: u32::from(net.prefix_len()),
        })),
        op: Operator::EQ,
    })
}

fn rule(table: &str, expr: Vec<Statement<'static>>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(NfListObject::Rule(Rule {
        family: NfFamily::INet,
        table: cow(table),
        chain: cow("gateway_out"),
        expr: expr.into(),
        ..Rule::default()
    })))
}

fn objects(spec: &EgressSpec, table: &str) -> Vec<NfObject<'static>> {
    let t = Table {
        family: NfFamily::INet,
        name: cow(table),
        handle: None,
    };
    let mut out = vec![
        NfObject::CmdObject(NfCmd::Add(NfListObject::Table(t.clone()))),
        NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(t.clone()))),
        NfObject::CmdObject(NfCmd::Add(NfListObject::Table(t))),
        NfObject::CmdObject(NfCmd::Add(NfListObject::Chain(Chain {
            family: NfFamily::INet,
            table: cow(table),
            name: cow("gateway_out"),
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Output),
            prio: Some(PRIORITY),
            policy: Some(NfChainPolicy::Accept),
            ..Chain::default()
        }))),
    ];
    let owner = owner_is(spec.owner);
    // Replies on connections others opened to a port the gateway listens
    // on (a published port, a metrics scrape on loopback) are not its own
    // egress. Limited to those ports: any other conntrack entry that began
    // outside the gateway gives it no path.
    for &port in &spec.reply_ports {
        out.push(rule(
            table,
            vec![
                owner.clone(),
                Statement::Match(Match {
                    left: Expression::Named(NamedExpression::CT(CT {
                        key: cow("direction"),
                        family: None,
                        dir: None,
                    })),
                    right: Expression::String(cow("reply")),
                    op: Operator::EQ,
                }),
                port_is("th", "sport", u32::from(port)),
                Statement::Accept(Some(Accept {})),
            ],
        ));
    }
    for resolver in &spec.resolvers {
        let net = IpNet::from(resolver.ip());
        for protocol in ["udp", "tcp"] {
            out.push(rule(
                table,
                vec![
                    owner.clone(),
                    daddr_in(&net),
                    port_is(protocol, "dport", u32::from(resolver.port())),
                    Statement::Accept(Some(Accept {})),
                ],
            ));
        }
    }
    for addr in &spec.tcp_only {
        out.push(rule(
            table,
            vec![
                owner.clone(),
                daddr_in(&IpNet::from(addr.ip())),
                port_is("tcp", "dport", u32::from(addr.port())),
                Statement::Accept(Some(Accept {})),
            ],
        ));
    }
    for kind in LOCAL_TYPES {
        let mut expr = vec![
            owner.clone(),
            Statement::Match(Match {
                left: Expression::Named(NamedExpression::Fib(Fib {
                    result: FibResult::Type,
                    flags: std::iter::once(FibFlag::Daddr).collect(),
                })),
                right: Expression::String(cow(kind)),
                op: Operator::EQ,
            }),
        ];
        expr.extend(drop_counted());
        out.push(rule(table, expr));
    }
    for net in &spec.deny_first {
        let mut expr = vec![owner.clone(), daddr_in(net)];
        expr.extend(drop_counted());
        out.push(rule(table, expr));
    }
    for net in &spec.allow {
        out.push(rule(
            table,
            vec![
                owner.clone(),
                daddr_in(net),
                Statement::Accept(Some(Accept {})),
            ],
        ));
    }
    for net in &spec.deny {
        let mut expr = vec![owner.clone(), daddr_in(net)];
        expr.extend(drop_counted());
        out.push(rule(table, expr));
    }
    out
}

fn verify(table: &str, rules: usize) -> Result<(), FloorError> {
    let listed = nft::list_table(WHAT, "inet", table)?;
    let mut chain_ok = false;
    let mut n = 0;
    for o in listed.objects.iter() {
        match o {
            NfObject::ListObject(NfListObject::Chain(c)) => {
                chain_ok |= c.hook == Some(NfHook::Output);
            }
            NfObject::ListObject(NfListObject::Rule(_)) => n += 1,
            _ => {}
        }
    }
    if !chain_ok || n != rules {
        return Err(FloorError::Verify {
            what: WHAT,
            detail: format!("inet {table}: output chain {chain_ok}, {n} of {rules} rules"),
        });
    }
    Ok(())
}

impl EgressFloor {
    /// Installs and verifies the floor in the namespace at `netns` (the
    /// caller's when `None`; the host's, for a gateway that runs there).
    ///
    /// # Errors
    /// `nft` missing or refusing, or the rules not what was applied.
    /// Nothing is left behind on error.
    pub fn install(netns: Option<&Path>, spec: &EgressSpec) -> Result<Self, FloorError> {
        let table = spec.owner.table();
        let rules = spec.rules();
        run_in(netns, || {
            nft::apply(WHAT, objects(spec, &table))?;
            if let Err(e) = verify(&table, rules) {
                let _ = nft::delete_table(WHAT, NfFamily::INet, &table);
                return Err(e);
            }
            Ok(())
        })?;
        Ok(Self {
            netns: netns.map(Path::to_owned),
            table,
            rules,
            removed: false,
        })
    }

    /// Whether the floor is still in place as installed.
    ///
    /// # Errors
    /// As for [`Self::install`].
    pub fn check(&self) -> Result<(), FloorError> {
        run_in(self.netns.as_deref(), || verify(&self.table, self.rules))
    }

    /// The `inet` table that holds the floor.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Hands the floor's removal to another process (e.g. a supervisor
    /// that outlives this one and calls [`remove_table`]): dropping the
    /// returned value no longer removes it. Returns the table's name.
    #[must_use]
    pub fn hand_off(mut self) -> String {
        self.removed = true;
        std::mem::take(&mut self.table)
    }

    /// Removes the floor.
    ///
    /// # Errors
    /// `nft` failed.
    pub fn remove(mut self) -> Result<(), FloorError> {
        self.removed = true;
        self.delete()
    }

    fn delete(&self) -> Result<(), FloorError> {
        if let Some(ns) = &self.netns
            && !ns.exists()
        {
            return Ok(());
        }
        run_in(self.netns.as_deref(), || {
            nft::delete_table(WHAT, NfFamily::INet, &self.table)
        })
    }
}

impl Drop for EgressFloor {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.delete();
        }
    }
}

/// The removal of an egress floor's table, prepared ahead: `nft -f -` is
/// started now and reads its script only when [`Removal::run`] writes it.
/// For a supervisor that may not be able to start a process by the time
/// it must clean up (one that made a PID namespace whose init has
/// exited can no longer fork). Dropped without `run`, the waiting `nft`
/// is killed and the table stays.
#[derive(Debug)]
pub struct Removal {
    child: Option<std::process::Child>,
    table: String,
}

impl Removal {
    /// Starts `nft -f -` in the caller's namespace, to delete `table`
    /// later. `adjust` may change the command before it is spawned (e.g.
    /// close inherited descriptors in the child).
    ///
    /// # Errors
    /// The name is not one of ours, or `nft` cannot be started.
    pub fn prepare(
        table: &str,
        adjust: impl FnOnce(&mut std::process::Command),
    ) -> Result<Self, FloorError> {
        check_ours(table)?;
        let mut cmd = std::process::Command::new(nft::program()?);
        cmd.args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        adjust(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| FloorError::NftMissing(format!("nft: {e}")))?;
        Ok(Self {
            child: Some(child),
            table: table.to_owned(),
        })
    }

    /// Deletes the table (present or not: it is added first, in the same
    /// transaction) and waits for `nft`.
    ///
    /// # Errors
    /// `nft` refused or could not be fed.
    pub fn run(mut self) -> Result<(), FloorError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let script = format!(
            "add table inet {t}\ndelete table inet {t}\n",
            t = self.table
        );
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| FloorError::NftMissing(format!("writing to nft: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| FloorError::NftMissing(format!("waiting for nft: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            Err(FloorError::NftFailed {
                what: WHAT,
                stderr: format!("{} ({})", stderr, out.status),
            })
        }
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn check_ours(table: &str) -> Result<(), FloorError> {
    let ours = table
        .strip_prefix("sluice_egress_")
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if ours {
        Ok(())
    } else {
        Err(FloorError::Verify {
            what: WHAT,
            detail: format!("{table:?} is not an egress floor table"),
        })
    }
}

/// Whether a floor for `owner` is installed in the namespace at `netns`
/// (the caller's when `None`): another gateway holds that owner, or a run
/// whose supervisor was killed left it.
///
/// # Errors
/// `nft` missing or refusing.
pub fn is_installed(netns: Option<&Path>, owner: Owner) -> Result<bool, FloorError> {
    let want = format!("table inet {}", owner.table());
    run_in(netns, || {
        Ok(nft::list_text(WHAT, &["tables", "inet"])?
            .lines()
            .any(|l| l.trim() == want))
    })
}

/// Removes an egress floor's table by name, in the namespace at `netns`
/// (the caller's when `None`): a supervisor cleaning up after the process
/// that installed it ([`EgressFloor::hand_off`]; see also [`Removal`]). Only our own tables
/// (`sluice_egress_*`) are touched; a missing table is not an error.
///
/// # Errors
/// The name is not one of ours, or `nft` failed.
pub fn remove_table(netns: Option<&Path>, table: &str) -> Result<(), FloorError> {
    check_ours(table)?;
    run_in(netns, || nft::delete_table(WHAT, NfFamily::INet, table))
}

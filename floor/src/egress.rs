//! The egress floor: the gateway's own packets (matched by its uid) never
//! reach loopback, link-local, the host's addresses or non-public ranges,
//! except what the policy names.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use nftables::expr::{
    CT, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix,
};
use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Rule, Table};
use nftables::stmt::{self, Accept, Counter, Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use crate::netns::run_in;
use crate::nft::{self, FloorError};

const WHAT: &str = "egress floor";

/// Destinations the gateway's own sockets never reach unless allowed:
/// loopback, unspecified, link-local (metadata services), the RFC 1918,
/// CGNAT, benchmarking and ULA ranges, multicast and the reserved block.
/// The caller adds the host's own addresses and the cloud host services
/// (`sluice_policy::platform` knows them).
#[must_use]
pub fn non_public() -> Vec<IpNet> {
    [
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "fe80::/10",
        "fc00::/7",
        "ff00::/8",
    ]
    .iter()
    .filter_map(|s| s.parse().ok())
    .collect()
}

/// What the egress floor holds the gateway to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSpec {
    /// The gateway's uid: only its packets are matched.
    pub uid: u32,
    /// Destinations dropped ([`non_public`], the host's addresses, ...).
    pub deny: Vec<IpNet>,
    /// Destinations inside `deny` the policy names (`internal`, `cidr`),
    /// accepted first.
    pub allow: Vec<IpNet>,
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

fn uid_is(uid: u32) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Meta(Meta {
            key: MetaKey::Skuid,
        })),
        right: Expression::Number(uid),
        op: Operator::EQ,
    })
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
            prio: Some(crate::ingress::PRIORITY),
            policy: Some(NfChainPolicy::Accept),
            ..Chain::default()
        }))),
    ];
    // Replies on connections others opened to the gateway (a published
    // port, a metrics scrape on loopback) are not its own egress.
    out.push(rule(
        table,
        vec![
            uid_is(spec.uid),
            Statement::Match(Match {
                left: Expression::Named(NamedExpression::CT(CT {
                    key: cow("direction"),
                    family: None,
                    dir: None,
                })),
                right: Expression::String(cow("reply")),
                op: Operator::EQ,
            }),
            Statement::Accept(Some(Accept {})),
        ],
    ));
    for net in &spec.allow {
        out.push(rule(
            table,
            vec![
                uid_is(spec.uid),
                daddr_in(net),
                Statement::Accept(Some(Accept {})),
            ],
        ));
    }
    for net in &spec.deny {
        out.push(rule(
            table,
            vec![
                uid_is(spec.uid),
                daddr_in(net),
                Statement::Counter(Counter::Anonymous(None)),
                Statement::Drop(Some(stmt::Drop {})),
            ],
        ));
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
        let table = format!("sluice_egress_{}", spec.uid);
        let rules = 1 + spec.allow.len() + spec.deny.len();
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

//! Every compiled rule's id, pattern and ports, packed for the checks: ids
//! and patterns live in one string, and port lists are interned (a policy
//! uses a handful of distinct port sets however many rules it has), so a
//! 100,000-rule policy is three allocations here, and a port filter reads a
//! small, hot array instead of each rule.

use crate::compile::Transport;
use crate::fx::FxMap;

/// One rule: its id and pattern are `text[start..start + id_len]` and the
/// `pattern_len` bytes after it.
#[derive(Clone, Copy, Debug)]
struct PackedRule {
    start: u32,
    id_len: u32,
    pattern_len: u32,
    ports: u32,
}

/// The TCP and UDP ports a rule allows (sorted, deduplicated).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct PortSet {
    tcp: Box<[u16]>,
    udp: Box<[u16]>,
}

/// The rules of one policy (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct RuleTable {
    rules: Vec<PackedRule>,
    text: String,
    port_sets: Vec<PortSet>,
    /// Compile-time index of `port_sets`; emptied by [`RuleTable::freeze`].
    port_index: FxMap<PortSet, u32>,
}

impl RuleTable {
    /// The number of rules.
    pub(crate) fn len(&self) -> usize {
        self.rules.len()
    }

    /// The index of the port set `(tcp, udp)`, added if new.
    pub(crate) fn port_set(&mut self, tcp: &[u16], udp: &[u16]) -> Option<u32> {
        let set = PortSet {
            tcp: tcp.into(),
            udp: udp.into(),
        };
        if let Some(&i) = self.port_index.get(&set) {
            return Some(i);
        }
        let i = u32::try_from(self.port_sets.len()).ok()?;
        self.port_sets.push(set.clone());
        self.port_index.insert(set, i);
        Some(i)
    }

    /// Add a rule; its index, or `None` past 2^32 rules or text bytes.
    pub(crate) fn push(&mut self, id: &str, pattern: &str, ports: u32) -> Option<u32> {
        let index = u32::try_from(self.rules.len()).ok()?;
        let rule = PackedRule {
            start: u32::try_from(self.text.len()).ok()?,
            id_len: u32::try_from(id.len()).ok()?,
            pattern_len: u32::try_from(pattern.len()).ok()?,
            ports,
        };
        self.text.push_str(id);
        self.text.push_str(pattern);
        u32::try_from(self.text.len()).ok()?;
        self.rules.push(rule);
        Some(index)
    }

    /// Drop compile-time state and spare capacity.
    pub(crate) fn freeze(&mut self) {
        self.port_index = FxMap::default();
        self.rules.shrink_to_fit();
        self.text.shrink_to_fit();
        self.port_sets.shrink_to_fit();
    }

    /// Rule `index`'s id and pattern.
    pub(crate) fn texts(&self, index: u32) -> Option<(&str, &str)> {
        let r = self.rules.get(index as usize)?;
        let start = r.start as usize;
        let mid = start + r.id_len as usize;
        let end = mid + r.pattern_len as usize;
        Some((self.text.get(start..mid)?, self.text.get(mid..end)?))
    }

    /// Rule `index`'s id, pattern, TCP ports and UDP ports.
    pub(crate) fn describe(&self, index: u32) -> Option<(&str, &str, &[u16], &[u16])> {
        let (id, pattern) = self.texts(index)?;
        let set = self.ports_of(index)?;
        Some((
            id,
            pattern,
            self.ports(set, Transport::Tcp),
            self.ports(set, Transport::Udp),
        ))
    }

    /// Rule `index`'s port set.
    pub(crate) fn ports_of(&self, index: u32) -> Option<u32> {
        self.rules.get(index as usize).map(|r| r.ports)
    }

    /// Whether port set `set` allows `port` over `transport`.
    #[inline]
    pub(crate) fn allows(&self, set: u32, transport: Transport, port: u16) -> bool {
        self.ports(set, transport).contains(&port)
    }

    /// Port set `set`'s ports for `transport` (empty for an unknown set).
    pub(crate) fn ports(&self, set: u32, transport: Transport) -> &[u16] {
        self.port_sets
            .get(set as usize)
            .map_or(&[], |s| match transport {
                Transport::Tcp => &s.tcp,
                Transport::Udp => &s.udp,
            })
    }
}

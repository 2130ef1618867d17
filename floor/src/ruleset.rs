//! A namespace's ruleset as `nft list ruleset` prints it, read for what
//! the ingress floor needs: every base chain (its hook, devices, priority,
//! policy and whether it holds rules) and every flowtable (its devices).
//!
//! The text listing, not the JSON one: nft 1.0.6's JSON leaves out a
//! netdev chain's and a flowtable's devices, which is the one thing asked
//! here.

/// One base chain (a chain with a hook).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub(crate) family: String,
    pub(crate) table: String,
    pub(crate) name: String,
    pub(crate) hook: String,
    /// Device names (a trailing `*` is a wildcard prefix, kernel 6.16+).
    pub(crate) devices: Vec<String>,
    /// `None` when the listing's priority could not be read.
    pub(crate) priority: Option<i32>,
    pub(crate) policy_drop: bool,
    /// Whether the chain holds any rule.
    pub(crate) has_rules: bool,
}

/// One flowtable: frames of its devices that match an offloaded flow are
/// forwarded at its ingress hook, past every forward chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Flowtable {
    pub(crate) family: String,
    pub(crate) table: String,
    pub(crate) name: String,
    pub(crate) devices: Vec<String>,
}

/// What [`parse`] found.
#[derive(Debug, Default)]
pub(crate) struct Ruleset {
    pub(crate) chains: Vec<BaseChain>,
    pub(crate) flowtables: Vec<Flowtable>,
}

impl BaseChain {
    /// Whether the chain is hooked on `iface`.
    pub(crate) fn on(&self, iface: &str) -> bool {
        on(&self.devices, iface)
    }
}

impl Flowtable {
    /// Whether the flowtable takes `iface`'s frames.
    pub(crate) fn on(&self, iface: &str) -> bool {
        on(&self.devices, iface)
    }
}

fn on(devices: &[String], iface: &str) -> bool {
    devices.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => iface.starts_with(prefix),
        None => d == iface,
    })
}

/// The block being read at depth 2.
enum Block {
    Chain { name: String, body: Vec<String> },
    Flowtable { name: String, body: Vec<String> },
    Other,
}

/// Reads `nft list ruleset` output.
pub(crate) fn parse(text: &str) -> Ruleset {
    let mut out = Ruleset::default();
    let mut depth = 0usize;
    let mut table: Option<(String, String)> = None;
    let mut block = Block::Other;
    for raw in text.lines() {
        let line = raw.trim();
        let before = depth;
        if before == 0 {
            let mut words = line.split_whitespace();
            if words.next() == Some("table") {
                table = match (words.next(), words.next()) {
                    (Some(f), Some(n)) => Some((f.to_owned(), n.to_owned())),
                    _ => None,
                };
            }
        } else if before == 1 {
            let mut words = line.split_whitespace();
            let name = |w: Option<&str>| w.unwrap_or_default().to_owned();
            block = match words.next() {
                Some("chain") => Block::Chain {
                    name: name(words.next()),
                    body: Vec::new(),
                },
                Some("flowtable") => Block::Flowtable {
                    name: name(words.next()),
                    body: Vec::new(),
                },
                _ => Block::Other,
            };
        } else if before == 2
            && let Block::Chain { body, .. } | Block::Flowtable { body, .. } = &mut block
            && !line.is_empty()
            && line != "}"
        {
            body.push(line.to_owned());
        }
        depth = next_depth(depth, line);
        if before >= 2 && depth < 2 {
            let done = std::mem::replace(&mut block, Block::Other);
            if let Some((family, tname)) = &table {
                finish(&mut out, family, tname, done);
            }
        }
        if depth == 0 {
            table = None;
        }
    }
    out
}

/// Brace depth after `line` (braces inside double quotes do not count).
fn next_depth(mut depth: usize, line: &str) -> usize {
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    depth
}

fn finish(out: &mut Ruleset, family: &str, table: &str, block: Block) {
    match block {
        Block::Chain { name, body } => {
            // nft prints a chain's comment on its own line before the
            // `type ... hook ...` line; a comment's words never count.
            let Some(hook_line) = body
                .iter()
                .find(|l| l.starts_with("type ") && word_after(l, "hook").is_some())
            else {
                return; // a regular chain: reached only by a jump from a base chain
            };
            let has_rules = body.iter().any(|l| {
                !std::ptr::eq(l, hook_line)
                    && !l.starts_with("policy ")
                    && !l.starts_with("comment ")
            });
            out.chains.push(BaseChain {
                family: family.to_owned(),
                table: table.to_owned(),
                name,
                hook: word_after(hook_line, "hook").unwrap_or_default(),
                devices: devices(hook_line),
                priority: priority(family, hook_line),
                policy_drop: body.iter().any(|l| {
                    !l.starts_with("comment ") && (l.contains("policy drop;") || l == "policy drop")
                }),
                has_rules,
            });
        }
        Block::Flowtable { name, body } => {
            let devices = body.iter().flat_map(|l| devices(l)).collect();
            out.flowtables.push(Flowtable {
                family: family.to_owned(),
                table: table.to_owned(),
                name,
                devices,
            });
        }
        Block::Other => {}
    }
}

/// The word after `key` in `line` (`hook ingress` gives `ingress`).
fn word_after(line: &str, key: &str) -> Option<String> {
    let mut words = line.split(|c: char| c.is_whitespace() || c == ';');
    words.by_ref().find(|w| *w == key)?;
    words
        .find(|w| !w.is_empty())
        .map(|w| w.trim_matches('"').to_owned())
}

/// `device "x"`, `device x` or `devices = { a, "b" }` in `line`.
fn devices(line: &str) -> Vec<String> {
    if let Some(start) = line.find("devices = {") {
        let rest = &line[start + "devices = {".len()..];
        let inner = rest.split('}').next().unwrap_or_default();
        return inner
            .split(',')
            .map(|d| d.trim().trim_matches('"').to_owned())
            .filter(|d| !d.is_empty())
            .collect();
    }
    word_after(line, "device").into_iter().collect()
}

/// The numeric priority of the hook line: a number, or a standard name
/// with an optional `+ N` / `- N`.
fn priority(family: &str, line: &str) -> Option<i32> {
    let start = line.find("priority ")? + "priority ".len();
    let spec = line[start..].split(';').next()?.trim();
    let mut words = spec.split_whitespace();
    let first = words.next()?;
    let base = match first.parse::<i32>() {
        Ok(n) => n,
        Err(_) => match (family, first) {
            (_, "filter") => 0,
            ("netdev", _) => return None,
            (_, "raw") => -300,
            (_, "mangle") => -150,
            (_, "dstnat") => -100,
            (_, "security") => 50,
            (_, "srcnat") => 100,
            _ => return None,
        },
    };
    match (words.next(), words.next()) {
        (None, _) => Some(base),
        (Some("+"), Some(n)) => base.checked_add(n.parse().ok()?),
        (Some("-"), Some(n)) => base.checked_sub(n.parse().ok()?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"table netdev foo {
	chain c {
		type filter hook ingress device "a0" priority -600; policy accept;
		meta l4proto udp fwd to "eth1"
	}

	chain e {
		type filter hook egress devices = { a0, a1 } priority filter; policy accept;
	}
}
table inet bar {
	set s {
		type ipv4_addr
		elements = { 10.0.0.1, 10.0.0.2,
			     10.0.0.3 }
	}

	flowtable f2 {
		hook ingress priority filter + 5
		devices = { a1, "tap*" }
	}

	chain i {
		type filter hook ingress device a1 priority raw - 10; policy accept;
	}

	chain plain {
		ip saddr @s accept
	}
}
table netdev sluice_floor_a0_1 {
	chain guest_in {
		type filter hook ingress device "a0" priority -500; policy drop;
	}
}
"#;

    #[test]
    fn chains_flowtables_devices_and_priorities_are_read() {
        let r = parse(LISTING);
        let names: Vec<_> = r.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["c", "e", "i", "guest_in"]);
        let c = &r.chains[0];
        assert_eq!(
            (c.family.as_str(), c.table.as_str(), c.hook.as_str()),
            ("netdev", "foo", "ingress")
        );
        assert_eq!(c.devices, ["a0"]);
        assert_eq!(c.priority, Some(-600));
        assert!(c.has_rules && !c.policy_drop);
        let e = &r.chains[1];
        assert_eq!(e.devices, ["a0", "a1"]);
        assert_eq!((e.hook.as_str(), e.priority), ("egress", Some(0)));
        assert!(!e.has_rules);
        assert_eq!(r.chains[2].priority, Some(-310));
        assert_eq!(r.chains[2].devices, ["a1"]);
        let g = &r.chains[3];
        assert!(g.policy_drop && !g.has_rules && g.on("a0") && !g.on("a1"));
        assert_eq!(r.flowtables.len(), 1);
        let f = &r.flowtables[0];
        assert_eq!(f.name, "f2");
        assert!(f.on("a1") && f.on("tap7") && !f.on("a0"));
    }

    /// A comment naming a hook or a drop policy (nft prints it on the
    /// line before the chain's `type` line) changes nothing that is read.
    #[test]
    fn a_chains_comment_is_not_its_hook_or_its_policy() {
        let r = parse(
            "table netdev x {\n\tchain c {\n\t\tcomment \"dup hook for capture; policy drop;\"\n\t\ttype filter hook ingress device \"tap0\" priority -600; policy accept;\n\t\tdup to \"a9\"\n\t}\n}\n",
        );
        let c = &r.chains[0];
        assert_eq!(c.devices, ["tap0"]);
        assert_eq!((c.hook.as_str(), c.priority), ("ingress", Some(-600)));
        assert!(c.has_rules && !c.policy_drop);
    }

    #[test]
    fn an_unknown_priority_reads_as_none() {
        let r = parse(
            "table netdev x {\n\tchain c {\n\t\ttype filter hook ingress device \"a\" priority raw; policy accept;\n\t}\n}\n",
        );
        assert_eq!(r.chains[0].priority, None);
    }
}

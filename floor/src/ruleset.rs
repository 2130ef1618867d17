//! A namespace's ruleset, read for what the ingress floor needs: every
//! table (and whether it carries flags: `dormant` unhooks all its chains
//! without changing one), every base chain (its hook, devices, priority,
//! policy and whether it holds rules) and every flowtable (its devices).
//!
//! The structure comes from nft's JSON: `nft -j list chains` and `nft -j
//! list flowtables`, and the rules of the chains asked about from `nft -j
//! list chain`. JSON escapes every name and comment, so no name, comment
//! or program name can forge, hide or shift an object there, as they can
//! in the text listing (nft prints names unquoted, and a newline or a
//! brace in one desynchronises any reader of the whole text). Not `nft -j
//! list ruleset`: nft 1.0.6 prints a table's flags from freed memory
//! there, and its JSON is then often invalid; a table's flags are read
//! from `nft list table` of the tables asked about (ours: names of safe
//! characters, and nothing of anyone else's printed before the flags).
//!
//! nft 1.0.6's JSON leaves out the devices of netdev chains and
//! flowtables, the one thing the floor asks of them (1.0.7 and later give
//! them as `dev`, used when present). Those are read from the text of that
//! one object, `nft list chain FAMILY TABLE NAME` (or `list flowtable`),
//! strictly: the listing must be of the object asked for, hold exactly one
//! `type … hook …` line (a comment with a newline forging a second makes
//! it unreadable), and every device must be a token of characters that
//! cannot end a device list early (none of `, { } " ; \`). Anything else
//! is [`Devices::Unreadable`], which every caller takes as the worst case
//! (fail closed): a foreign chain whose devices cannot be read counts as
//! one on the interface, a floor whose devices cannot be read does not
//! verify. The chains are listed again after the other listings and must
//! be the same (same handles, hooks, priorities and policies), so that all
//! of them describe one state.

use serde_json::Value;

use crate::nft::FloorError;

/// The devices a chain or flowtable is hooked on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Devices {
    /// Device names (a trailing `*` is a wildcard prefix, kernel 6.16+).
    Known(Vec<String>),
    /// They could not be read unambiguously: why.
    Unreadable(String),
}

/// One table asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) family: String,
    pub(crate) name: String,
    /// `None` without flags; else its flags as listed.
    pub(crate) flags: Option<String>,
}

/// One base chain (a chain with a hook).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub(crate) family: String,
    pub(crate) table: String,
    pub(crate) name: String,
    pub(crate) handle: u64,
    pub(crate) hook: String,
    pub(crate) devices: Devices,
    /// `None` when the listing's priority could not be read.
    pub(crate) priority: Option<i32>,
    pub(crate) policy_drop: bool,
    /// Whether the chain holds any rule (`true`, the worst case, for a
    /// chain whose rules were not asked about).
    pub(crate) has_rules: bool,
}

/// One flowtable: frames of its devices that match an offloaded flow are
/// forwarded at its ingress hook, past every forward chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Flowtable {
    pub(crate) family: String,
    pub(crate) table: String,
    pub(crate) name: String,
    pub(crate) handle: u64,
    pub(crate) devices: Devices,
}

/// What [`read`] found: every base chain and flowtable, and the tables
/// asked about that exist.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Ruleset {
    pub(crate) tables: Vec<Table>,
    pub(crate) chains: Vec<BaseChain>,
    pub(crate) flowtables: Vec<Flowtable>,
    /// How many rules the listing held (of the one chain listed).
    pub(crate) rules: usize,
    /// Every regular chain (family, table, name): one in a floor's table
    /// means someone else put it there.
    pub(crate) regular: Vec<(String, String, String)>,
}

impl Ruleset {
    /// The table `name` of `family`, if listed.
    pub(crate) fn table(&self, family: &str, name: &str) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.name == name)
    }
}

impl BaseChain {
    /// Whether the chain may be hooked on `iface` (one whose devices
    /// cannot be read may).
    pub(crate) fn on(&self, iface: &str) -> bool {
        on(&self.devices, iface)
    }
}

impl Flowtable {
    /// Whether the flowtable may take `iface`'s frames (one whose devices
    /// cannot be read may).
    pub(crate) fn on(&self, iface: &str) -> bool {
        on(&self.devices, iface)
    }
}

fn on(devices: &Devices, iface: &str) -> bool {
    match devices {
        Devices::Known(names) => names.iter().any(|d| match d.strip_suffix('*') {
            Some(prefix) => iface.starts_with(prefix),
            None => d == iface,
        }),
        Devices::Unreadable(_) => true,
    }
}

/// How many times the ruleset is read before a ruleset that changes
/// under every reading is given up on.
const READS: usize = 3;

/// Runs `nft` with the arguments given and returns what it printed.
pub(crate) type Nft<'a> = dyn Fn(&[&str]) -> Result<String, FloorError> + 'a;

/// Reads the ruleset of the calling thread's namespace (module docs), with
/// the flags of the tables `tables` (family, name) and the rules of the
/// chains in tables whose name starts with `rules_in`.
pub(crate) fn read(
    what: &'static str,
    nft: &Nft<'_>,
    tables: &[(&str, &str)],
    rules_in: &str,
) -> Result<Ruleset, FloorError> {
    let unreadable = |detail: String| FloorError::NftFailed {
        what,
        stderr: format!("its JSON listing could not be read: {detail}"),
    };
    let json = |args: &[&str]| -> Result<Value, FloorError> {
        serde_json::from_str(&nft(args)?).map_err(|e| unreadable(e.to_string()))
    };
    let structure = || -> Result<Ruleset, FloorError> {
        let mut rules = from_json(&json(&["-j", "list", "chains"])?).map_err(unreadable)?;
        rules.flowtables = from_json(&json(&["-j", "list", "flowtables"])?)
            .map_err(unreadable)?
            .flowtables;
        Ok(rules)
    };
    for _ in 0..READS {
        let mut rules = structure()?;
        for c in &mut rules.chains {
            if needs_listing(&c.devices) {
                c.devices = listed(nft, "chain", &c.family, &c.table, &c.name, Some(&c.hook));
            }
            c.has_rules = true;
            if c.table.starts_with(rules_in) && nameable(&c.table) && nameable(&c.name) {
                let list = json(&["-j", "list", "chain", &c.family, &c.table, &c.name])?;
                c.has_rules = from_json(&list).map_err(unreadable)?.rules > 0;
            }
        }
        for f in &mut rules.flowtables {
            if needs_listing(&f.devices) {
                f.devices = listed(nft, "flowtable", &f.family, &f.table, &f.name, None);
            }
        }
        for (family, name) in tables {
            if let Some(flags) = table_flags(nft, family, name)? {
                rules.tables.push(Table {
                    family: (*family).to_owned(),
                    name: (*name).to_owned(),
                    flags,
                });
            }
        }
        if same_structure(&structure()?, &rules) {
            return Ok(rules);
        }
    }
    Err(FloorError::NftFailed {
        what,
        stderr: format!("the ruleset changed under each of {READS} readings"),
    })
}

/// Every table (family, name) of the namespace, from `nft -j list
/// tables`. nft 1.0.6 prints a flagged table's flags from freed memory
/// there, so this may fail on a namespace that holds one: for best-effort
/// uses only.
pub(crate) fn tables(nft: &Nft<'_>) -> Result<Vec<(String, String)>, String> {
    let text = nft(&["-j", "list", "tables"]).map_err(|e| e.to_string())?;
    let json: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    json.get("nftables")
        .and_then(Value::as_array)
        .ok_or("no `nftables` list")?
        .iter()
        .filter_map(|item| item.get("table"))
        .map(|t| Ok((string(t, "family")?, string(t, "name")?)))
        .collect()
}

/// The flags of the table `name` of `family` from `nft list table`
/// (`None`: no such table; `Some(None)`: no flags). Only the lines before
/// the table's first block count: nothing of anyone else's (a chain's
/// comment) is printed there.
fn table_flags(
    nft: &Nft<'_>,
    family: &str,
    name: &str,
) -> Result<Option<Option<String>>, FloorError> {
    if !nameable(name) {
        return Ok(Some(Some(format!(
            "unreadable: `{}` cannot be named to nft",
            name.escape_debug()
        ))));
    }
    let text = match nft(&["list", "table", family, name]) {
        Ok(text) => text,
        Err(FloorError::NftFailed { stderr, .. })
            if stderr.contains("No such file or directory") =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if !lines
        .next()
        .is_some_and(|l| opens(l, &["table", family, name]))
    {
        return Ok(Some(Some(
            "unreadable: the listing is not of that table".to_owned(),
        )));
    }
    let flags: Vec<&str> = lines
        .take_while(|l| !l.ends_with('{') && *l != "}")
        .filter_map(|l| l.strip_prefix("flags "))
        .collect();
    Ok(Some((!flags.is_empty()).then(|| flags.join(", "))))
}

/// Marks a chain or flowtable whose devices the JSON did not give.
const NOT_LISTED: &str = "not listed yet";

fn needs_listing(d: &Devices) -> bool {
    matches!(d, Devices::Unreadable(why) if why == NOT_LISTED)
}

/// Whether `a` and `b` list the same chains and flowtables (apart from
/// what was read of each separately: devices, rules, table flags).
fn same_structure(a: &Ruleset, b: &Ruleset) -> bool {
    type ChainKey<'a> = (&'a str, &'a str, &'a str, u64, &'a str, Option<i32>, bool);
    fn chain(c: &BaseChain) -> ChainKey<'_> {
        (
            &c.family,
            &c.table,
            &c.name,
            c.handle,
            &c.hook,
            c.priority,
            c.policy_drop,
        )
    }
    fn flowtable(f: &Flowtable) -> (&str, &str, &str, u64) {
        (&f.family, &f.table, &f.name, f.handle)
    }
    a.chains.iter().map(chain).eq(b.chains.iter().map(chain))
        && a.flowtables
            .iter()
            .map(flowtable)
            .eq(b.flowtables.iter().map(flowtable))
}

fn string(o: &Value, key: &str) -> Result<String, String> {
    o.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("an object without `{key}`: {o}"))
}

/// Devices as the JSON gives them (`"dev": "a"` or `"dev": ["a", "b"]`,
/// nft 1.0.7 and later), else whether they must be listed: a netdev
/// chain, an inet ingress chain and a flowtable have devices; no other
/// chain has any.
fn json_devices(o: &Value, family: &str, hook: Option<&str>) -> Devices {
    match o.get("dev") {
        Some(Value::String(d)) => Devices::Known(vec![d.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|d| d.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map_or_else(
                || Devices::Unreadable(format!("a `dev` that is not a list of names: {a:?}")),
                Devices::Known,
            ),
        Some(other) => Devices::Unreadable(format!("an unknown `dev`: {other}")),
        None if family == "netdev" || hook.is_none() || hook == Some("ingress") => {
            Devices::Unreadable(NOT_LISTED.to_owned())
        }
        None => Devices::Known(Vec::new()),
    }
}

/// The chains, flowtables and rules in a JSON listing (module docs).
fn from_json(json: &Value) -> Result<Ruleset, String> {
    let items = json
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no `nftables` list")?;
    let mut out = Ruleset::default();
    for item in items {
        if let Some(c) = item.get("chain") {
            let Some(hook) = c.get("hook").and_then(Value::as_str) else {
                // A regular chain: reached only by a jump from a base chain.
                out.regular.push((
                    string(c, "family")?,
                    string(c, "table")?,
                    string(c, "name")?,
                ));
                continue;
            };
            let family = string(c, "family")?;
            out.chains.push(BaseChain {
                devices: json_devices(c, &family, Some(hook)),
                family,
                table: string(c, "table")?,
                name: string(c, "name")?,
                handle: c.get("handle").and_then(Value::as_u64).unwrap_or(0),
                hook: hook.to_owned(),
                priority: c
                    .get("prio")
                    .and_then(Value::as_i64)
                    .and_then(|p| i32::try_from(p).ok()),
                policy_drop: c.get("policy").and_then(Value::as_str) == Some("drop"),
                has_rules: true,
            });
        } else if item.get("rule").is_some() {
            out.rules += 1;
        } else if let Some(f) = item.get("flowtable") {
            let family = string(f, "family")?;
            out.flowtables.push(Flowtable {
                devices: json_devices(f, &family, None),
                family,
                table: string(f, "table")?,
                name: string(f, "name")?,
                handle: f.get("handle").and_then(Value::as_u64).unwrap_or(0),
            });
        }
    }
    Ok(out)
}

/// Whether nft's command line takes `name` as the bare word it is (its
/// scanner's identifier: a letter, `_` or `.`, then those, digits, `/` and
/// `-`). Any other name (one with a quote, a space or a newline, or one
/// nft reads as a keyword) cannot be asked about safely.
fn nameable(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && name.len() <= 256
}

/// The devices of one chain or flowtable (`kind`) from `nft list KIND
/// FAMILY TABLE NAME` (module docs); `hook` is the chain's hook as the
/// JSON gave it.
fn listed(
    nft: &dyn Fn(&[&str]) -> Result<String, FloorError>,
    kind: &str,
    family: &str,
    table: &str,
    name: &str,
    hook: Option<&str>,
) -> Devices {
    if let Some(bad) = [family, table, name].into_iter().find(|n| !nameable(n)) {
        return Devices::Unreadable(format!("`{}` cannot be named to nft", bad.escape_debug()));
    }
    match nft(&["list", kind, family, table, name]) {
        Ok(text) => devices_in_listing(&text, kind, family, table, name, hook)
            .map_or_else(Devices::Unreadable, Devices::Known),
        Err(e) => Devices::Unreadable(e.to_string()),
    }
}

/// The devices in the listing of one chain or flowtable.
fn devices_in_listing(
    text: &str,
    kind: &str,
    family: &str,
    table: &str,
    name: &str,
    hook: Option<&str>,
) -> Result<Vec<String>, String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() < 2
        || !opens(lines[0], &["table", family, table])
        || !opens(lines[1], &[kind, name])
    {
        return Err(format!(
            "the listing is not of {kind} {family} {table} {name}"
        ));
    }
    let marker = if kind == "chain" { "type " } else { "device" };
    let found: Vec<&str> = lines[2..]
        .iter()
        .copied()
        .filter(|l| l.starts_with(marker))
        .collect();
    match (kind, found.as_slice()) {
        ("chain", [line]) => hook_devices(line, hook),
        ("flowtable", []) => Ok(Vec::new()),
        ("flowtable", [line]) => device_list(&line.split_whitespace().collect::<Vec<_>>()),
        (_, lines) => Err(format!(
            "{} lines start with `{}` in the listing of {kind} {family} {table} {name}",
            lines.len(),
            marker.trim_end()
        )),
    }
}

/// Whether `line` opens the block of `words` (`table netdev NAME {`): the
/// words, then `{`. A name may be quoted (`"NAME"`), as a later nft may
/// print it: the names asked about are [`nameable`], so a quoted one
/// holds no space or quote, and one pair of quotes around it is taken
/// off before comparing.
fn opens(line: &str, words: &[&str]) -> bool {
    let mut got = line.split_whitespace();
    words
        .iter()
        .all(|w| got.next().is_some_and(|g| unquoted(g) == *w))
        && got.next() == Some("{")
        && got.next().is_none()
}

/// `word` without one pair of double quotes around it.
fn unquoted(word: &str) -> &str {
    word.strip_prefix('"')
        .and_then(|w| w.strip_suffix('"'))
        .unwrap_or(word)
}

/// The devices of a chain's `type T hook H [device D | devices = {…}]
/// priority …` line; `hook` is the hook the JSON gave.
fn hook_devices(line: &str, hook: Option<&str>) -> Result<Vec<String>, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["type", _, "hook", h, rest @ ..] if Some(*h) == hook => match rest {
            ["device", d, ..] => device(d).map(|d| vec![d]),
            ["devices", ..] => device_list(rest),
            _ => Ok(Vec::new()),
        },
        _ => Err(format!("an unexpected hook line: {line}")),
    }
}

/// `devices = { a, b }` (the words, from `devices` on).
fn device_list(words: &[&str]) -> Result<Vec<String>, String> {
    let ["devices" | "device", "=", "{", rest @ ..] = words else {
        return Err(format!("an unexpected device list: {}", words.join(" ")));
    };
    let end = rest
        .iter()
        .position(|w| *w == "}")
        .ok_or("a device list without its end")?;
    let list = &rest[..end];
    let mut out = Vec::with_capacity(list.len());
    for (i, word) in list.iter().enumerate() {
        let last = i + 1 == list.len();
        let name = match (word.strip_suffix(','), last) {
            (Some(name), false) => name,
            (None, true) => word,
            _ => return Err(format!("an unexpected device list: {}", words.join(" "))),
        };
        out.push(device(name)?);
    }
    Ok(out)
}

/// One device word (quoted or not), of the characters an unambiguous
/// listing can hold.
fn device(word: &str) -> Result<String, String> {
    let name = unquoted(word);
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b",{}\";\\".contains(&b));
    if plain {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "a device named `{}`, which the listing cannot show unambiguously",
            name.escape_debug()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nft -j list chains` of nft 1.0.6 (no devices), trimmed.
    const CHAINS: &str = r#"{"nftables": [
 {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
 {"chain": {"family": "netdev", "table": "foo", "name": "c", "handle": 1, "type": "filter", "hook": "ingress", "prio": -600, "policy": "accept"}},
 {"chain": {"family": "netdev", "table": "sluice_floor_x", "name": "e", "handle": 3, "type": "filter", "hook": "egress", "prio": 0, "policy": "accept"}},
 {"chain": {"family": "inet", "table": "bar", "name": "f", "handle": 1, "type": "filter", "hook": "forward", "prio": -500, "policy": "drop"}},
 {"chain": {"family": "inet", "table": "bar", "name": "plain", "handle": 4}}
]}"#;

    /// `nft -j list flowtables` of nft 1.0.7 (with devices).
    const FLOWTABLES: &str = r#"{"nftables": [
 {"flowtable": {"family": "inet", "name": "ft", "table": "bar", "handle": 5, "hook": "ingress", "prio": 0, "dev": ["a1", "tap*"]}}
]}"#;

    /// What `nft` prints for each listing asked.
    fn fake(args: &[&str]) -> Result<String, FloorError> {
        let text = match args {
            ["-j", "list", "chains"] => CHAINS,
            ["-j", "list", "flowtables"] => FLOWTABLES,
            ["-j", "list", "chain", "netdev", "sluice_floor_x", "e"] => {
                r#"{"nftables": [{"chain": {"family": "netdev", "table": "sluice_floor_x", "name": "e", "handle": 3, "hook": "egress", "prio": 0, "policy": "accept"}}]}"#
            }
            ["list", "chain", "netdev", "foo", "c"] => {
                "table netdev foo {\n\tchain c {\n\t\tcomment \"dup hook for capture\"\n\t\ttype filter hook ingress device \"a0\" priority -600; policy accept;\n\t\tfwd to \"eth1\"\n\t}\n}\n"
            }
            ["list", "chain", "netdev", "sluice_floor_x", "e"] => {
                "table netdev sluice_floor_x {\n\tchain e {\n\t\ttype filter hook egress devices = { a0, a1 } priority filter; policy accept;\n\t}\n}\n"
            }
            ["list", "table", "netdev", "sluice_floor_x"] => {
                "table netdev sluice_floor_x {\n\tchain e {\n\t\ttype filter hook egress devices = { a0, a1 } priority filter; policy accept;\n\t}\n}\n"
            }
            ["list", "table", "inet", "bar"] => {
                "table inet bar {\n\tflags dormant\n\n\tchain f {\n\t\tcomment \"x\n\tflags owner\"\n\t\ttype filter hook forward priority -500; policy drop;\n\t}\n}\n"
            }
            ["list", "table", "inet", "gone"] => {
                return Err(FloorError::NftFailed {
                    what: "test",
                    stderr: "Error: No such file or directory".to_owned(),
                });
            }
            other => panic!("unexpected nft {other:?}"),
        };
        Ok(text.to_owned())
    }

    fn read_all(nft: &Nft<'_>) -> Result<Ruleset, FloorError> {
        let tables = [
            ("netdev", "sluice_floor_x"),
            ("inet", "bar"),
            ("inet", "gone"),
        ];
        read("test", nft, &tables, "sluice_floor_")
    }

    #[test]
    fn structure_comes_from_the_json_and_devices_from_each_chains_listing() {
        let r = read_all(&fake).unwrap();
        assert_eq!(r.tables.len(), 2, "{:?}", r.tables);
        assert_eq!(r.table("netdev", "sluice_floor_x").unwrap().flags, None);
        let bar = r.table("inet", "bar").unwrap();
        assert_eq!(bar.flags.as_deref(), Some("dormant"), "{bar:?}");
        assert!(r.table("inet", "gone").is_none());
        let names: Vec<_> = r.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["c", "e", "f"]);
        let c = &r.chains[0];
        assert_eq!(c.devices, Devices::Known(vec!["a0".to_owned()]));
        assert_eq!((c.hook.as_str(), c.priority), ("ingress", Some(-600)));
        assert!(
            c.has_rules && !c.policy_drop,
            "rules not asked: may hold some"
        );
        let e = &r.chains[1];
        assert_eq!(
            e.devices,
            Devices::Known(vec!["a0".to_owned(), "a1".to_owned()])
        );
        assert!(!e.has_rules);
        let f = &r.chains[2];
        assert_eq!(f.devices, Devices::Known(Vec::new()));
        assert!(f.policy_drop && f.priority == Some(-500));
        let ft = &r.flowtables[0];
        assert!(ft.on("a1") && ft.on("tap7") && !ft.on("a0"));
    }

    #[test]
    fn a_ruleset_that_changes_under_every_reading_is_an_error() {
        let n = std::cell::Cell::new(0u64);
        let changing = |args: &[&str]| -> Result<String, FloorError> {
            if args == ["-j", "list", "chains"] {
                n.set(n.get() + 1);
                return Ok(CHAINS.replace("\"handle\": 3", &format!("\"handle\": {}", n.get() + 9)));
            }
            fake(args)
        };
        let e = read_all(&changing).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");
    }

    fn chain_devices(listing: &str) -> Result<Vec<String>, String> {
        devices_in_listing(listing, "chain", "netdev", "t", "c", Some("ingress"))
    }

    /// An interface named `x}` (the kernel allows it) ends no device list
    /// early: the listing is unreadable, never read as `x`.
    #[test]
    fn a_device_name_that_could_end_a_list_makes_it_unreadable() {
        let ok = "table netdev t {\n\tchain c {\n\t\ttype filter hook ingress devices = { g0, x1 } priority -600; policy accept;\n\t}\n}\n";
        assert_eq!(chain_devices(ok).unwrap(), ["g0", "x1"]);
        for bad in [
            "devices = { x}, g0 }",
            "devices = { g0, x} }",
            "devices = { a\"b, g0 }",
            "devices = { g0 x }",
            "device \"x;\"",
        ] {
            let listing = format!(
                "table netdev t {{\n\tchain c {{\n\t\ttype filter hook ingress {bad} priority -600; policy accept;\n\t}}\n}}\n"
            );
            assert!(chain_devices(&listing).is_err(), "{bad}");
        }
    }

    /// A comment with a newline prints a forged `type` line before the
    /// real one: two of them make the listing unreadable.
    #[test]
    fn a_forged_hook_line_makes_the_listing_unreadable() {
        let forged = "table netdev t {\n\tchain c {\n\t\tcomment \"x\n\t\ttype filter hook ingress device \"other\" priority -600; policy accept;\"\n\t\ttype filter hook ingress device \"g0\" priority -600; policy accept;\n\t}\n}\n";
        assert!(chain_devices(forged).is_err());
        let other = "table netdev t {\n\tchain d {\n\t\ttype filter hook ingress device \"g0\" priority -600; policy accept;\n\t}\n}\n";
        assert!(chain_devices(other).is_err(), "another chain's listing");
    }

    /// A later nft may quote table, chain and flowtable names in its text
    /// listing: they are the same names.
    #[test]
    fn quoted_names_in_a_listing_are_the_names() {
        let quoted = "table netdev \"sluice_floor_x\" {\n\tchain \"e\" {\n\t\ttype filter hook egress device \"a0\" priority 0; policy accept;\n\t}\n}\n";
        assert_eq!(
            devices_in_listing(
                quoted,
                "chain",
                "netdev",
                "sluice_floor_x",
                "e",
                Some("egress")
            ),
            Ok(vec!["a0".to_owned()])
        );
        let nft = |args: &[&str]| -> Result<String, FloorError> {
            assert_eq!(args, ["list", "table", "netdev", "sluice_floor_x"]);
            Ok("table netdev \"sluice_floor_x\" {\n\tflags dormant\n}\n".to_owned())
        };
        assert_eq!(
            table_flags(&nft, "netdev", "sluice_floor_x").unwrap(),
            Some(Some("dormant".to_owned()))
        );
        for other in [
            "table netdev \"sluice_floor_y\" {",
            "table netdev sluice_floor_x",
            "table netdev \"sluice_floor_x {",
        ] {
            assert!(
                !opens(other, &["table", "netdev", "sluice_floor_x"]),
                "{other}"
            );
        }
    }

    #[test]
    fn names_nft_cannot_take_as_words_are_not_asked_about() {
        for ok in [
            "filter",
            "DOCKER-USER",
            "a.b",
            "sluice_floor_g0_1_2",
            "_x/y",
        ] {
            assert!(nameable(ok), "{ok}");
        }
        for bad in ["", "1abc", "a b", "a\"b", "a\nb", "t;list", "x}"] {
            assert!(!nameable(bad), "{bad}");
        }
        let d = listed(&fake, "chain", "netdev", "a\nb", "c", Some("ingress"));
        assert!(matches!(d, Devices::Unreadable(_)));
        assert!(on(&d, "anything"));
    }
}

//! Reading a policy: from a file (with its approval overlay), from YAML
//! text, or from `--allow-domain` names; the size limit, and the parser's
//! errors said in the policy's terms at `origin:line:col`.

use std::path::Path;

use super::{CompileOptions, CompiledPolicy, Compiler};
use crate::error::{PolicyError, PolicyErrors};
use crate::model::RawPolicy;

/// The largest policy file read (16 MiB); larger files are rejected before
/// parsing.
pub const MAX_POLICY_BYTES: u64 = 16 * 1024 * 1024;

/// Read and compile a policy file, with its approval overlay
/// ([`crate::overlay`], `NAME.approved.yaml` beside it) when there is one.
/// The error list names the file at fault as its origin.
///
/// # Errors
/// Every problem found, each `file:line:col: message`.
pub fn load_file(path: &Path, options: &CompileOptions) -> Result<CompiledPolicy, PolicyErrors> {
    let origin = path.display().to_string();
    let fail = |message: String| PolicyErrors::whole_file(&origin, message);
    let meta =
        std::fs::metadata(path).map_err(|e| fail(format!("cannot read policy file: {e}")))?;
    if meta.len() > MAX_POLICY_BYTES {
        return Err(fail(format!(
            "policy file is {} bytes; the limit is {MAX_POLICY_BYTES}",
            meta.len()
        )));
    }
    let src =
        std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read policy file: {e}")))?;
    let Some((overlay, overlay_origin)) = crate::overlay::read(path)? else {
        return from_yaml_str(&src, &origin, options);
    };
    // The overlay is checked on its own first, so its errors name it.
    let alone = parse_raw(&overlay, &overlay_origin)?;
    crate::overlay::check(&alone, &overlay_origin)?;
    Compiler::new(&overlay_origin).compile(alone, options)?;
    let mut raw = parse_raw(&src, &origin)?;
    raw.allow
        .extend(parse_raw(&overlay, &overlay_origin)?.allow);
    Compiler::new(&origin).compile(raw, options)
}

/// Compile a policy from YAML text. `origin` names it in errors (a path, or
/// e.g. `<embedded default>`).
///
/// # Errors
/// Every problem found, each `origin:line:col: message`.
pub fn from_yaml_str(
    src: &str,
    origin: &str,
    options: &CompileOptions,
) -> Result<CompiledPolicy, PolicyErrors> {
    if src.len() as u64 > MAX_POLICY_BYTES {
        return Err(PolicyErrors::new(vec![PolicyError {
            origin: origin.to_owned(),
            line: 0,
            column: 0,
            message: format!(
                "policy is {} bytes; the limit is {MAX_POLICY_BYTES}",
                src.len()
            ),
        }]));
    }
    let raw = parse_raw(src, origin)?;
    Compiler::new(origin).compile(raw, options)
}

/// The YAML text of a policy allowing exactly `domains` on port 443 (what
/// `sluice run --allow-domain NAME` hands the gateway). Each entry is a
/// pattern as in an allow rule (`example.com`, `*.example.com`,
/// `**.example.com`); the text is valid YAML whatever the entries contain,
/// and [`from_domains`] reports entries that are not valid patterns.
#[must_use]
pub fn allow_domains_yaml(domains: &[&str]) -> String {
    let mut src = String::from(
        "# Generated from --allow-domain.\nversion: 1\nid: allow-domain\nlabel: \"--allow-domain\"\nallow:",
    );
    if domains.is_empty() {
        src.push_str(" []\n");
    } else {
        src.push('\n');
    }
    for d in domains {
        // A JSON string is a valid YAML double-quoted scalar.
        let quoted = serde_json::to_string(d).unwrap_or_default();
        src.push_str("  - domain: ");
        src.push_str(&quoted);
        src.push('\n');
    }
    src
}

/// Compile [`allow_domains_yaml`]`(domains)`.
///
/// # Errors
/// The problems with the given names (positions refer to the generated
/// text and are omitted; the origin is `--allow-domain`).
pub fn from_domains(
    domains: &[&str],
    options: &CompileOptions,
) -> Result<CompiledPolicy, PolicyErrors> {
    from_yaml_str(&allow_domains_yaml(domains), "--allow-domain", options).map_err(|errs| {
        PolicyErrors::new(
            errs.into_iter()
                .map(|e| PolicyError {
                    line: 0,
                    column: 0,
                    ..e
                })
                .collect(),
        )
    })
}

pub(crate) fn parse_raw(src: &str, origin: &str) -> Result<RawPolicy, PolicyErrors> {
    let mut opts = serde_saphyr::Options::default();
    // Large allowlists (100k+ rules) exceed the parser's default node and
    // event budgets; the input size cap bounds them instead (every node
    // takes at least one byte). Alias and anchor limits stay at their
    // defaults (billion-laughs protection).
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = usize::try_from(MAX_POLICY_BYTES).unwrap_or(usize::MAX);
    budget.max_events = budget.max_nodes.saturating_mul(2);
    opts.budget = Some(budget);
    opts.with_snippet = false;
    opts.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    serde_saphyr::from_str_with_options::<RawPolicy>(src, opts).map_err(|e| {
        let (line, column) = e
            .location()
            .map_or((0, 0), |l| (clamp_u32(l.line()), clamp_u32(l.column())));
        PolicyErrors::new(vec![PolicyError {
            origin: origin.to_owned(),
            line,
            column,
            message: yaml_message(&e),
        }])
    })
}

pub(super) fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The parser's message without its own position suffix (we print ours in
/// front).
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let at_start = e
        .location()
        .is_none_or(|l| l.line() <= 1 && l.column() <= 1);
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().trim().to_owned();
    let cut = first
        .rfind(" at line ")
        .map_or(first.as_str(), |i| first.get(..i).unwrap_or_default());
    let msg = cut.trim_end_matches(':').trim();
    if let Some(key) = msg.strip_prefix("duplicate mapping key: ") {
        let key = key.split(", set DuplicateKeyPolicy").next().unwrap_or(key);
        return format!("duplicate key `{key}`; each key may appear only once in a mapping");
    }
    if let Some(field) = msg.strip_prefix("missing field ") {
        return format!("missing required key {field}");
    }
    // The parser's terse messages, said in the policy's terms.
    let rewritten = match msg {
        "expected sequence start" => "expected a list here: `[a, b]` or one `- item` per line",
        "expected mapping start" if at_start => {
            "expected a mapping (`key: value` lines); a policy starts with `version: 1` and `id: NAME`"
        }
        "expected mapping start" => "expected a mapping here (`key: value` lines)",
        m if m.contains("found a tab") => {
            "found a tab character; YAML indentation and separation must use spaces"
        }
        "expected string scalar" => "expected a single string here",
        "invalid i64" => "expected a whole number here",
        "invalid boolean" => "expected `true` or `false` here",
        "unexpected end of input" => {
            "unexpected end of input; a policy needs at least `version: 1` and `id: NAME`"
        }
        m if m.starts_with("data did not match any variant of untagged enum RawUpstream") => {
            "`upstream` must be `system` or a list of resolver addresses, e.g. [192.0.2.53, \"[2001:db8::53]:53\"]"
        }
        m if m.starts_with("multiple YAML documents detected") => {
            "a policy file holds one YAML document; remove the `---` and what follows it"
        }
        "" => return text,
        m => m,
    };
    rewritten.to_owned()
}

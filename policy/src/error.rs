//! Policy errors: every problem found in a policy file, each with its
//! position.

use std::fmt;

/// One problem in a policy file.
///
/// Displays as `file:line:col: message` (1-based line and column, counted in
/// characters), or `file: message` when no position applies (the file could
/// not be read). The message says what is wrong and what would be right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// The origin name given when loading (usually the file path).
    pub origin: String,
    /// 1-based line, or 0 when unknown.
    pub line: u32,
    /// 1-based column, or 0 when unknown.
    pub column: u32,
    /// What is wrong and what would be right.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.origin, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for PolicyError {}

/// Every error found while loading a policy (never empty when returned as an
/// `Err`). Displays one error per line, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyErrors {
    errors: Vec<PolicyError>,
}

impl PolicyErrors {
    pub(crate) fn new(mut errors: Vec<PolicyError>) -> Self {
        errors.sort_by_key(|e| (e.line, e.column));
        errors.dedup();
        Self { errors }
    }

    /// One error about the file `origin` as a whole (it cannot be read,
    /// or is refused before any of it is parsed): no line or column.
    pub(crate) fn whole_file(origin: &str, message: String) -> Self {
        Self::new(vec![PolicyError {
            origin: origin.to_owned(),
            line: 0,
            column: 0,
            message,
        }])
    }

    /// The errors, sorted by position.
    #[must_use]
    pub fn errors(&self) -> &[PolicyError] {
        &self.errors
    }

    /// The number of errors.
    #[must_use]
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Whether there are no errors (never true for a returned `Err`).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

impl IntoIterator for PolicyErrors {
    type Item = PolicyError;
    type IntoIter = std::vec::IntoIter<PolicyError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

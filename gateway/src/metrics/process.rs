//! The process's resident memory and open descriptors, read from
//! `/proc/self` at scrape time.
//!
//! Both files are opened when the registry is made, before the gateway
//! restricts itself: its Landlock ruleset forbids opening `/proc` later,
//! while a descriptor already open keeps working (procfs regenerates a
//! file's text on each read from offset 0, and a directory is re-listed
//! after a rewind). Where `/proc` is absent (`sluice run`'s jail mounts
//! none) the two metrics are left out of the exposition.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use rustix::fs::Dir;

/// Reads `/proc/self/status` (`VmRSS`) and lists `/proc/self/fd` per scrape.
#[derive(Debug)]
pub(super) struct ProcessCollector {
    status: Option<File>,
    fds: Option<Mutex<Dir>>,
}

impl ProcessCollector {
    /// Opens both; a missing one leaves its metric out.
    pub(super) fn open() -> Self {
        let status = File::open("/proc/self/status")
            .inspect_err(|e| tracing::debug!(error = %e, "metrics: no /proc/self/status"))
            .ok();
        let fds = File::open("/proc/self/fd")
            .and_then(|f| Dir::new(f).map_err(std::io::Error::from))
            .inspect_err(|e| tracing::debug!(error = %e, "metrics: no /proc/self/fd"))
            .ok()
            .map(Mutex::new);
        Self { status, fds }
    }

    /// Resident set size in bytes (`VmRSS`, which the kernel gives in kB).
    fn rss_bytes(&self) -> Option<u64> {
        let file = self.status.as_ref()?;
        let mut buf = vec![0u8; 4096];
        let mut len = 0;
        loop {
            if len == buf.len() {
                buf.resize(len * 2, 0);
            }
            let n = file.read_at(&mut buf[len..], len as u64).ok()?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let text = std::str::from_utf8(&buf[..len]).ok()?;
        let kb: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// Open descriptors, the directory's own one not counted.
    fn open_fds(&self) -> Option<u64> {
        let mut dir = self.fds.as_ref()?.lock().ok()?;
        dir.rewind();
        let mut n = 0u64;
        while let Some(entry) = dir.read() {
            let name = entry.ok()?;
            if !matches!(name.file_name().to_bytes(), b"." | b"..") {
                n += 1;
            }
        }
        Some(n.saturating_sub(1))
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(rss) = self.rss_bytes() {
            let g = ConstGauge::new(i64::try_from(rss).unwrap_or(i64::MAX));
            let m = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory of the gateway process (VmRSS).",
                None,
                g.metric_type(),
            )?;
            g.encode(m)?;
        }
        if let Some(fds) = self.open_fds() {
            let g = ConstGauge::new(i64::try_from(fds).unwrap_or(i64::MAX));
            let m = encoder.encode_descriptor(
                "process_open_fds",
                "Open file descriptors of the gateway process.",
                None,
                g.metric_type(),
            )?;
            g.encode(m)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_and_descriptors_on_every_scrape() {
        let c = ProcessCollector::open();
        for _ in 0..2 {
            assert!(c.rss_bytes().is_some_and(|b| b > 0));
            // At least the collector's own status file is open.
            assert!(c.open_fds().is_some_and(|n| n >= 1));
        }
    }
}

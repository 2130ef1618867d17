//! Just enough ELF reading to tell a static executable from a dynamic one.

/// `PT_INTERP`: the program header naming a dynamic loader.
const PT_INTERP: u32 = 3;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// For the first bytes of a 64-bit little-endian ELF file: `Some(true)` when
/// no program header asks for a dynamic loader, `Some(false)` when one does,
/// `None` when the bytes are not such an ELF file or its program headers lie
/// beyond `head`.
pub(super) fn is_static_executable(head: &[u8]) -> Option<bool> {
    if head.get(..4)? != b"\x7fELF" || head.get(4)? != &2 || head.get(5)? != &1 {
        return None;
    }
    let phoff = usize::try_from(u64_at(head, 0x20)?).ok()?;
    let phentsize = usize::from(u16_at(head, 0x36)?);
    let phnum = usize::from(u16_at(head, 0x38)?);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(head, at)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(path: &str) -> Vec<u8> {
        let mut b = std::fs::read(path).unwrap();
        b.truncate(4096);
        b
    }

    #[test]
    fn tells_static_from_dynamic_binaries() {
        // busybox-static and a dynamically linked coreutils binary.
        if std::path::Path::new("/bin/busybox").exists() {
            assert_eq!(is_static_executable(&head("/bin/busybox")), Some(true));
        }
        assert_eq!(is_static_executable(&head("/bin/ls")), Some(false));
        assert_eq!(is_static_executable(b"#!/bin/sh\n"), None);
        assert_eq!(is_static_executable(b"\x7fELF\x02\x01"), None);
    }
}

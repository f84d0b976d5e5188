//! Human-readable sizes.

/// `4096` → `4 KiB`, `1536` → `1.5 KiB`, `100` → `100 B`.
pub fn size(bytes: f64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in units {
        let m = m as f64;
        if bytes >= m {
            let v = bytes / m;
            return if (v - v.round()).abs() < 1e-9 { format!("{v:.0} {u}") } else { format!("{v:.1} {u}") };
        }
    }
    format!("{bytes:.0} B")
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::size(100.0), "100 B");
        assert_eq!(super::size(4096.0), "4 KiB");
        assert_eq!(super::size(1536.0), "1.5 KiB");
        assert_eq!(super::size((32u64 << 20) as f64), "32 MiB");
        assert_eq!(super::size((3u64 << 30) as f64), "3 GiB");
    }
}

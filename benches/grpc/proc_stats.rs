//! A server process's CPU time and resident memory, read from /proc (Linux), for the
//! benchmark tools that drive it (loadgen, attack).
#![allow(dead_code)] // each tool uses its part

/// utime + stime of `pid`, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command name: state is field 3; utime and stime are fields 14 and 15.
    let get = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

pub(crate) fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The highest resident memory of `pid` since it started (VmHWM), in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

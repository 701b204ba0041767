//! What machine the benchmarks ran on (the `"machine"` object of the JSON output).

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::engines::CgroupCap;

fn first_line_after(path: &str, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_owned())
}

/// Logical cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn fs_type(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: statfs fills the zeroed struct we pass; `c` is a valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as u64 {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x6573_5546 => "fuse".into(),
        other => format!("{other:#x}"),
    }
}

/// Whether `O_DIRECT` works in `dir`.
fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(".strata-bench-direct-probe");
    let ok = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(&p).is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}

/// The machine description: cores, memory, kernel, CPU, virtualisation, the data directory's
/// filesystem and whether it takes `O_DIRECT`, and whether mmap's memory can be capped.
pub fn describe(data_dir: &Path) -> Value {
    let mem_kib: Option<u64> = first_line_after("/proc/meminfo", "MemTotal").and_then(|v| v.trim_end_matches("kB").trim().parse().ok());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()).unwrap_or_else(|_| "unknown".into());
    let cpu = first_line_after("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
    let flags = first_line_after("/proc/cpuinfo", "flags").unwrap_or_default();
    let mut m = Map::new();
    m.insert("cores".into(), cores().into());
    m.insert("memory_bytes".into(), json!(mem_kib.map(|k| k * 1024)));
    m.insert("kernel".into(), kernel.into());
    m.insert("cpu".into(), cpu.into());
    m.insert("virtualized".into(), flags.split_whitespace().any(|f| f == "hypervisor").into());
    m.insert("arch".into(), std::env::consts::ARCH.into());
    m.insert("data_dir".into(), data_dir.display().to_string().into());
    m.insert("data_fs".into(), fs_type(data_dir).into());
    m.insert("direct_io".into(), direct_io_works(data_dir).into());
    match CgroupCap::probe() {
        Ok(()) => {
            m.insert("mmap_cap".into(), "cgroup v2 memory.max".into());
        }
        Err(why) => {
            m.insert("mmap_cap".into(), Value::Null);
            m.insert("mmap_cap_unavailable".into(), why.into());
        }
    }
    Value::Object(m)
}

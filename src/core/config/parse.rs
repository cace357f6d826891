//! Reading the configuration from the environment: each variable of the
//! table (variables.rs) parsed as its kind, or its default. A value that
//! does not parse is an error naming the variable, the value and what is
//! accepted; so is a `SOMA_*` variable within a few edits of one in the table
//! (a misspelt one would otherwise be ignored without a word); any other is
//! another program's, and gets a warning. With `SOMA_DISABLE=1` nothing is
//! checked. No FFI here.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::Once;

use super::settings::{Bytes, Config, FreeOrder, LegacyCache, MemInfo, PoolChoice, StatsOutput};
use super::variables::{Kind, Value, Variable, VARIABLES};
use crate::core::edit_distance::edit_distance;
use crate::core::output;

/// A configuration that cannot be used. Each message names the variable, the
/// value as given (quoted, with bytes that are not UTF-8 as `\xNN`) and what
/// is accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse (or is not UTF-8).
    BadValue { variable: &'static str, value: String, accepted: &'static str },
    /// A `SOMA_*` variable that is not in the table but a misspelling of one.
    UnknownVariable { name: String, value: String, closest: &'static str },
    /// `SOMA_MIN_BYTES` above `SOMA_MAX_BYTES`: nothing would be pooled.
    EmptySizeRange { min: String, max: String },
    /// Two of the output files (`SOMA_STATS`, `SOMA_TRACE`, `SOMA_SNAPSHOT`)
    /// naming one file: one would replace the other. Each: the variable and its value.
    SameFile { first: (&'static str, String), second: (&'static str, String) },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::BadValue { variable, value, accepted } => {
                write!(f, "somashim: {variable}=\"{value}\" is not valid; accepted: {accepted}")
            }
            ConfigError::UnknownVariable { name, value, closest } => {
                let known: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
                write!(
                    f,
                    "somashim: {name}=\"{value}\" is not a somashim variable; did you mean {closest}? accepted: {}",
                    known.join(", ")
                )
            }
            ConfigError::EmptySizeRange { min, max } => write!(
                f,
                "somashim: SOMA_MIN_BYTES=\"{min}\" is more than SOMA_MAX_BYTES=\"{max}\", so nothing would be \
                 pooled; accepted: SOMA_MIN_BYTES at most SOMA_MAX_BYTES (SOMA_DISABLE=1 passes every call through)"
            ),
            ConfigError::SameFile { first: (a, a_value), second: (b, b_value) } => write!(
                f,
                "somashim: {a}=\"{a_value}\" and {b}=\"{b_value}\" name the same file, so one would replace \
                 the other; accepted: two different files"
            ),
        }
    }
}

impl Config {
    /// Reads the configuration from the process's environment (`vars`: every
    /// name and value; those not starting with `SOMA_` are not looked at).
    /// `SOMA_*` variables of other programs are warned of, once a process.
    pub fn from_environment(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<Config, ConfigError> {
        let (config, others) = Config::read(vars)?;
        if !others.is_empty() {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                output::warn(format_args!("ignoring SOMA_* variables that are not somashim's: {}", others.join(", ")))
            });
        }
        Ok(config)
    }

    /// Whether `SOMA_DISABLE` set to `value` turns the shim off, read as the
    /// whole configuration reads it, without the other variables.
    pub fn disables(value: Option<&OsStr>) -> bool {
        let given = value.map(|value| (OsString::from("SOMA_DISABLE"), value.to_owned()));
        Config::read(given).is_ok_and(|(config, _)| config.disable)
    }

    /// The configuration, and the `SOMA_*` variables it leaves to other
    /// programs (as the messages show them).
    fn read(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<(Config, Vec<String>), ConfigError> {
        let mut given: Vec<Option<OsString>> = vec![None; VARIABLES.len()];
        let mut unknown = Vec::new();
        for (name, value) in vars {
            if !name.as_bytes().starts_with(b"SOMA_") {
                continue;
            }
            match VARIABLES.iter().position(|v| v.name.as_bytes() == name.as_bytes()) {
                // The first of duplicate entries wins, as with getenv.
                Some(index) => {
                    given[index].get_or_insert(value);
                }
                None => unknown.push((name, value)),
            }
        }
        let mut config = Config::placeholder();
        for (variable, given) in VARIABLES.iter().zip(&given) {
            let default = OsStr::new(variable.default);
            let (text, value) = match variable.read(given.as_deref().unwrap_or(default)) {
                // SOMA_DISABLE=1 must let the program run as it would without
                // the shim, so nothing else is checked: a value that is not
                // valid is left at its default. SOMA_DISABLE is the table's
                // first row, so it is read before the others.
                Err(_) if config.disable => variable.read(default)?,
                read => read?,
            };
            (variable.store)(&mut config, value);
            config.effective.push((variable.name, text.to_string()));
        }
        if config.disable {
            return Ok((config, Vec::new()));
        }
        let mut others = Vec::new();
        for (name, value) in unknown {
            match misspelt(&name) {
                Some(closest) => {
                    return Err(ConfigError::UnknownVariable { name: shown(&name), value: shown(&value), closest })
                }
                None => others.push(shown(&name)),
            }
        }
        if config.min_bytes > config.max_bytes {
            let text = |name| config.effective.iter().find(|(n, _)| *n == name).map(|(_, t)| t.clone());
            return Err(ConfigError::EmptySizeRange {
                min: text("SOMA_MIN_BYTES").unwrap_or_default(),
                max: text("SOMA_MAX_BYTES").unwrap_or_default(),
            });
        }
        let stats = match &config.stats {
            StatsOutput::File(path) => Some(path),
            _ => None,
        };
        let outputs = [("SOMA_STATS", stats), ("SOMA_TRACE", config.trace.as_ref()), ("SOMA_SNAPSHOT", config.snapshot.as_ref())];
        let named: Vec<(&'static str, &String)> = outputs.into_iter().filter_map(|(name, path)| Some((name, path?))).collect();
        for (i, &(a, a_path)) in named.iter().enumerate() {
            if let Some(&(b, b_path)) = named[i + 1..].iter().find(|(_, b_path)| output::same_file(a_path, b_path)) {
                let value = |path: &String| shown(OsStr::new(path));
                return Err(ConfigError::SameFile { first: (a, value(a_path)), second: (b, value(b_path)) });
            }
        }
        Ok((config, others))
    }

    /// Every field before the table fills it in; never seen by callers.
    fn placeholder() -> Config {
        Config {
            disable: false,
            pool: PoolChoice::Own,
            release_threshold: Bytes::Exact(0),
            reuse_follow_event_deps: false,
            reuse_opportunistic: false,
            reuse_internal_deps: false,
            min_bytes: 0,
            max_bytes: 0,
            free_sync: false,
            host_pool: false,
            free_order: FreeOrder::Join,
            pending_free_limit: Bytes::Exact(0),
            legacy_cache: LegacyCache::Auto,
            track_work: true,
            small_blocks: 0,
            large_blocks: 0,
            memory_limit: Bytes::Exact(0),
            decay: None,
            idle: None,
            neighbours: false,
            socket_dir: None,
            stats: StatsOutput::Off,
            trace: None,
            snapshot: None,
            by_library: false,
            meminfo: MemInfo::Real,
            passthrough_callers: Vec::new(),
            log: String::new(),
            effective: Vec::new(),
        }
    }
}

impl Variable {
    /// `value` parsed, with its text; one that does not parse (or is not
    /// UTF-8) is an error naming the variable.
    fn read<'a>(&self, value: &'a OsStr) -> Result<(&'a str, Value), ConfigError> {
        let bad_value =
            || ConfigError::BadValue { variable: self.name, value: shown(value), accepted: self.kind.accepted_forms() };
        let text = value.to_str().ok_or_else(bad_value)?;
        Ok((text, parse(self.kind, text).ok_or_else(bad_value)?))
    }
}

/// A value as the messages show it: escaped as Rust writes a string, with
/// each byte that is not UTF-8 as `\xNN`.
fn shown(value: &OsStr) -> String {
    let mut out = String::new();
    for chunk in value.as_bytes().utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        out.extend(chunk.invalid().iter().map(|b| format!("\\x{b:02x}")));
    }
    out
}

/// The most edits (case aside) that make a `SOMA_*` name a misspelling of a
/// variable of the table (`SOMA_DISABEL`, `SOMA_STAT`) rather than another
/// program's (`SOMA_HOME`).
const MISSPELLING_EDITS: usize = 2;

/// The known variable that `name` is a misspelling of, if any: the nearest
/// by edit distance, case aside.
fn misspelt(name: &OsStr) -> Option<&'static str> {
    let name = name.as_bytes().to_ascii_uppercase();
    let (edits, closest) =
        VARIABLES.iter().map(|v| (edit_distance(&name, v.name.as_bytes()), v.name)).min_by_key(|&(edits, _)| edits)?;
    (edits <= MISSPELLING_EDITS).then_some(closest)
}

/// Only ASCII whitespace is trimmed: a Unicode space (a no-break space pasted
/// from a web page, say) is part of the value, and so makes it invalid.
fn parse(kind: Kind, text: &str) -> Option<Value> {
    let text = text.trim_ascii();
    match kind {
        Kind::Flag => parse_flag(text).map(Value::Flag),
        Kind::Size { allow_total } => match text.to_ascii_lowercase().as_str() {
            "total" if allow_total => Some(Value::Size(Bytes::DeviceTotal)),
            _ => parse_size(text).map(|n| Value::Size(Bytes::Exact(n))),
        },
        Kind::MinSize => parse_size(text).filter(|&n| n < u64::MAX).map(|n| Value::Size(Bytes::Exact(n))),
        // A limit of nothing would refuse every allocation: not a setting anyone means.
        Kind::Share => match text.strip_suffix('%') {
            Some(percent) => parse_percent(percent).map(|share| Value::Size(Bytes::DeviceShare(share))),
            None => parse_size(text).filter(|&n| n > 0).map(|n| Value::Size(Bytes::Exact(n))),
        },
        Kind::Millis => match text.parse::<u64>().ok()? {
            0 => Some(Value::Millis(None)),
            ms => Some(Value::Millis(Some(std::time::Duration::from_millis(ms)))),
        },
        Kind::Pool => match text.to_ascii_lowercase().as_str() {
            "own" => Some(Value::Pool(PoolChoice::Own)),
            "default" => Some(Value::Pool(PoolChoice::Default)),
            _ => None,
        },
        Kind::FreeOrder => match text.to_ascii_lowercase().as_str() {
            "barrier" => Some(Value::FreeOrder(FreeOrder::Barrier)),
            "join" => Some(Value::FreeOrder(FreeOrder::Join)),
            _ => None,
        },
        Kind::LegacyCache => match text.to_ascii_lowercase().as_str() {
            "auto" => Some(Value::LegacyCache(LegacyCache::Auto)),
            "on" => Some(Value::LegacyCache(LegacyCache::On)),
            "off" => Some(Value::LegacyCache(LegacyCache::Off)),
            _ => None,
        },
        Kind::Stats if text.is_empty() => Some(Value::Stats(StatsOutput::Off)),
        Kind::Stats => match file_path(text) {
            Some(path) => Some(Value::Stats(StatsOutput::File(path))),
            None => parse_flag(text).map(|on| Value::Stats(if on { StatsOutput::Stderr } else { StatsOutput::Off })),
        },
        Kind::Path if text.is_empty() => Some(Value::Path(None)),
        Kind::Path => file_path(text).map(|path| Value::Path(Some(path))),
        Kind::Directory if text.is_empty() => Some(Value::Path(None)),
        Kind::Directory => (text.starts_with('/') && text.len() <= MAX_SOCKET_DIR).then(|| Value::Path(Some(text.to_string()))),
        Kind::MemInfo => match text.to_ascii_lowercase().as_str() {
            "real" => Some(Value::MemInfo(MemInfo::Real)),
            "pool" => Some(Value::MemInfo(MemInfo::Pool)),
            _ => None,
        },
        Kind::List => Some(Value::List(
            text.split(',').map(str::trim_ascii).filter(|s| !s.is_empty()).map(String::from).collect(),
        )),
        Kind::LogFilter => text.split(',').all(is_log_directive).then(|| Value::Text(text.to_string())),
    }
}

/// A file to write: a path is told from a flag by its `/`, so that a flag
/// (`0`, `off`) or a mistyped one (`ture`) cannot become a file in the
/// current directory.
/// A socket's path (108 bytes at most) is the directory, `/`, and up to 27
/// bytes of name (`<pid>-<endpoint>`).
const MAX_SOCKET_DIR: usize = 80;

fn file_path(text: &str) -> Option<String> {
    text.contains('/').then(|| text.to_string())
}

/// One directive of `SOMA_LOG`: `level`, `module` or `module=level`, where a
/// module is the shim's (`somashim`, `somashim::core::trace`): nothing else in
/// the library logs. Empty ones (as in `warn,`) are allowed. env_logger takes
/// any word as a module name, so a typo (`verbose`) would silently turn the
/// log off: each directive is checked here.
fn is_log_directive(directive: &str) -> bool {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_level = |text: &str| LEVELS.iter().any(|level| level.eq_ignore_ascii_case(text));
    let is_module = |text: &str| {
        (text == "somashim" || text.starts_with("somashim::"))
            && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let directive = directive.trim_ascii();
    match directive.split_once('=') {
        Some((module, level)) => is_module(module) && is_level(level),
        None => directive.is_empty() || is_level(directive) || is_module(directive),
    }
}

/// A percentage above 0 and at most 100, with at most two decimals, in
/// hundredths of a percent (`12.5` is 1250).
fn parse_percent(text: &str) -> Option<u32> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 3 || fraction.len() > 2 || !digits(whole) || !digits(fraction) {
        return None;
    }
    let fraction: u32 = format!("{fraction:0<2}").parse().ok()?;
    let share = whole.parse::<u32>().ok()? * 100 + fraction;
    (1..=10_000).contains(&share).then_some(share)
}

fn parse_flag(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `4096`, `512MiB`, `4G`, `max`. Every unit is a power of 1024: K, KB and KiB
/// all mean 1024 bytes, as in most GPU tooling.
fn parse_size(text: &str) -> Option<u64> {
    let lower = text.trim_ascii().to_ascii_lowercase();
    if lower == "max" {
        return Some(u64::MAX);
    }
    let split = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let number: u64 = digits.parse().ok()?;
    let shift = match unit.trim_ascii() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn vars<'a>(pairs: &'a [(&str, &str)]) -> impl Iterator<Item = (OsString, OsString)> + 'a {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v)))
    }

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_environment(vars(pairs))
    }

    /// The variable a bad value was blamed on.
    fn blamed(error: ConfigError) -> &'static str {
        match error {
            ConfigError::BadValue { variable, .. } => variable,
            other => panic!("not a bad value: {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = config(&[]).unwrap();
        assert!(!c.disable);
        assert_eq!(c.pool, PoolChoice::Own);
        assert_eq!(c.release_threshold, Bytes::Exact(u64::MAX));
        assert!(!c.reuse_follow_event_deps && c.reuse_opportunistic && !c.reuse_internal_deps);
        assert_eq!((c.min_bytes, c.max_bytes), (1, u64::MAX));
        assert!(!c.free_sync);
        assert_eq!(c.free_order, FreeOrder::Join);
        assert_eq!(c.pending_free_limit, Bytes::Exact(64 << 20));
        assert_eq!(c.legacy_cache, LegacyCache::Auto);
        assert_eq!(c.memory_limit, Bytes::Exact(u64::MAX));
        assert_eq!(c.decay, Some(std::time::Duration::from_secs(1)));
        assert_eq!(c.idle, Some(std::time::Duration::from_millis(20)));
        assert!(c.neighbours);
        assert_eq!(c.stats, StatsOutput::Off);
        assert_eq!(c.trace, None);
        assert_eq!(c.meminfo, MemInfo::Real);
        assert!(c.passthrough_callers.is_empty());
        assert_eq!(c.log, "warn");
    }

    #[test]
    fn stats_go_to_stderr_or_a_file() {
        assert_eq!(config(&[("SOMA_STATS", "1")]).unwrap().stats, StatsOutput::Stderr);
        assert_eq!(config(&[("SOMA_STATS", "/tmp/s.txt")]).unwrap().stats, StatsOutput::File("/tmp/s.txt".into()));
        assert_eq!(config(&[("SOMA_STATS", "0")]).unwrap().stats, StatsOutput::Off);
        assert_eq!(config(&[("SOMA_STATS", "./s")]).unwrap().stats, StatsOutput::File("./s".into()));
        assert_eq!(config(&[("SOMA_STATS", "")]).unwrap().stats, StatsOutput::Off);
    }

    #[test]
    fn the_socket_directory_is_absolute_and_leaves_room_for_a_socket_name() {
        assert_eq!(config(&[]).unwrap().socket_dir, None);
        assert_eq!(config(&[("SOMA_SOCKET_DIR", "/tmp/jobs-a")]).unwrap().socket_dir.as_deref(), Some("/tmp/jobs-a"));
        assert_eq!(blamed(config(&[("SOMA_SOCKET_DIR", "jobs")]).unwrap_err()), "SOMA_SOCKET_DIR");
        let long = format!("/{}", "d".repeat(80));
        assert_eq!(blamed(config(&[("SOMA_SOCKET_DIR", long.as_str())]).unwrap_err()), "SOMA_SOCKET_DIR");
    }

    #[test]
    fn a_stats_path_needs_a_slash_so_a_mistyped_flag_is_an_error() {
        let e = config(&[("SOMA_STATS", "ture")]).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("SOMA_STATS=\"ture\"") && message.contains("./stats.txt"), "{message}");
        assert_eq!(blamed(config(&[("SOMA_STATS", "stats.txt")]).unwrap_err()), "SOMA_STATS");
    }

    #[test]
    fn a_trace_path_needs_a_slash_so_a_flag_is_an_error() {
        for flag in ["0", "1", "off", "trace.csv"] {
            let message = config(&[("SOMA_TRACE", flag)]).unwrap_err().to_string();
            assert!(message.contains(&format!("SOMA_TRACE=\"{flag}\"")) && message.contains("./trace.csv"), "{message}");
        }
        assert_eq!(config(&[("SOMA_TRACE", "./t.csv")]).unwrap().trace.as_deref(), Some("./t.csv"));
        assert_eq!(config(&[("SOMA_TRACE", "")]).unwrap().trace, None);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_an_error_not_unset() {
        let value = OsString::from_vec(b"1\xff".to_vec());
        let e = Config::from_environment([(OsString::from("SOMA_DISABLE"), value)]).unwrap_err();
        assert_eq!(e.to_string().lines().count(), 1);
        assert!(e.to_string().starts_with("somashim: SOMA_DISABLE=\"1\\xff\" is not valid; accepted: 0 or 1"), "{e}");
    }

    #[test]
    fn a_misspelt_variable_names_the_closest_known_one() {
        let e = config(&[("SOMA_DISABEL", "1")]).unwrap_err();
        assert!(matches!(&e, ConfigError::UnknownVariable { closest: "SOMA_DISABLE", .. }), "{e:?}");
        let message = e.to_string();
        assert!(message.contains("SOMA_DISABEL=\"1\"") && message.contains("did you mean SOMA_DISABLE?"), "{message}");
        let e = config(&[("SOMA_FOO", "1")]).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownVariable { closest: "SOMA_POOL", .. }), "{e:?}");
        assert!(config(&[("SOMASHIM_LIB", "/x.so"), ("PATH", "/bin"), ("SOMA", "1")]).is_ok(), "only SOMA_* is checked");
        assert_eq!(edit_distance(b"kitten", b"sitting"), 3);
        assert_eq!(edit_distance(b"", b"abc"), 3);
    }

    #[test]
    fn another_programs_variable_is_left_to_it() {
        let pairs = [("SOMA_HOME", "/opt"), ("SOMA_POOL", "default"), ("SOMA_CACHE_DIR", "/tmp")];
        let (c, others) = Config::read(vars(&pairs)).unwrap();
        assert_eq!(c.pool, PoolChoice::Default);
        assert_eq!(others, ["SOMA_HOME", "SOMA_CACHE_DIR"]);
        assert!(Config::read(vars(&[("SOMA_POOL", "own")])).unwrap().1.is_empty());
        let typos = [("SOMA_STAT", "SOMA_STATS"), ("SOMA_pool", "SOMA_POOL"), ("SOMA_TRACEE", "SOMA_TRACE"), ("SOMA_LGO", "SOMA_LOG")];
        for (typo, meant) in typos {
            let e = config(&[("SOMA_HOME", "/opt"), (typo, "1")]).unwrap_err();
            assert!(matches!(&e, ConfigError::UnknownVariable { closest, .. } if *closest == meant), "{typo}: {e:?}");
        }
    }

    #[test]
    fn with_disable_nothing_else_is_checked() {
        let not_utf8 = OsString::from_vec(b"\xff".to_vec());
        for variable in VARIABLES.iter().filter(|v| v.name != "SOMA_DISABLE") {
            let given = [("SOMA_DISABLE".into(), "1".into()), (variable.name.into(), not_utf8.clone())];
            let c = Config::from_environment(given).unwrap_or_else(|e| panic!("{}: {e}", variable.name));
            assert!(c.disable);
            let effective = (variable.name, variable.default.to_string());
            assert!(c.effective.contains(&effective), "{} is left at its default", variable.name);
        }
        let (c, others) = Config::read(vars(&[
            ("SOMA_DISABLE", "yes"),
            ("SOMA_DISABEL", "1"),
            ("SOMA_HOME", "/opt"),
            ("SOMA_MIN_BYTES", "2MiB"),
            ("SOMA_MAX_BYTES", "1MiB"),
            ("SOMA_STATS", "/tmp/soma.out"),
            ("SOMA_TRACE", "/tmp/soma.out"),
        ]))
        .unwrap();
        assert!(c.disable && others.is_empty());
        assert_eq!(blamed(config(&[("SOMA_DISABLE", "maybe"), ("SOMA_POOL", "shared")]).unwrap_err()), "SOMA_DISABLE");
        assert_eq!(blamed(config(&[("SOMA_DISABLE", "0"), ("SOMA_POOL", "shared")]).unwrap_err()), "SOMA_POOL");
    }

    #[test]
    fn log_filters_are_checked() {
        for good in ["warn", "", "off", "somashim=debug", "somashim::core::trace=TRACE", "somashim", "info,somashim=trace,"] {
            assert_eq!(config(&[("SOMA_LOG", good)]).unwrap().log, good, "{good}");
        }
        for bad in ["verbose", "=", "somashim=", "=debug", "somashim=loud", "warn/regex", "other=debug", "some shim"] {
            assert_eq!(blamed(config(&[("SOMA_LOG", bad)]).unwrap_err()), "SOMA_LOG", "{bad}");
        }
    }

    #[test]
    fn min_bytes_above_max_bytes_is_an_error() {
        let e = config(&[("SOMA_MIN_BYTES", "2MiB"), ("SOMA_MAX_BYTES", "1MiB")]).unwrap_err();
        assert_eq!(e, ConfigError::EmptySizeRange { min: "2MiB".into(), max: "1MiB".into() });
        assert!(e.to_string().contains("SOMA_MIN_BYTES=\"2MiB\" is more than SOMA_MAX_BYTES=\"1MiB\""), "{e}");
        assert!(config(&[("SOMA_MIN_BYTES", "1MiB"), ("SOMA_MAX_BYTES", "1MiB")]).is_ok());
    }

    #[test]
    fn min_bytes_of_max_pools_nothing_so_it_is_an_error() {
        for max in ["max", " MAX", "18446744073709551615"] {
            let message = config(&[("SOMA_MIN_BYTES", max)]).unwrap_err().to_string();
            assert!(message.contains("SOMA_MIN_BYTES") && message.contains("not max"), "{max}: {message}");
        }
        assert_eq!(config(&[("SOMA_MIN_BYTES", "1TiB")]).unwrap().min_bytes, 1 << 40);
        assert_eq!(config(&[("SOMA_MIN_BYTES", "0")]).unwrap().min_bytes, 0);
        assert_eq!(config(&[("SOMA_MAX_BYTES", "max")]).unwrap().max_bytes, u64::MAX);
    }

    #[test]
    fn a_forked_child_writes_files_of_its_own() {
        let settings = [("SOMA_STATS", "/tmp/s.txt"), ("SOMA_TRACE", "/tmp/t.csv"), ("SOMA_SNAPSHOT", "/tmp/o.json")];
        let mut child = config(&settings).unwrap();
        child.for_forked_child(42);
        assert_eq!(child.stats, StatsOutput::File("/tmp/s.txt.42".into()));
        assert_eq!((child.trace.as_deref(), child.snapshot.as_deref()), (Some("/tmp/t.csv.42"), Some("/tmp/o.json.42")));
    }

    #[test]
    fn stats_and_trace_in_one_file_is_an_error() {
        let e = config(&[("SOMA_STATS", "/tmp/soma.out"), ("SOMA_TRACE", "/tmp//soma.out")]).unwrap_err();
        let first = ("SOMA_STATS", "/tmp/soma.out".into());
        assert_eq!(e, ConfigError::SameFile { first, second: ("SOMA_TRACE", "/tmp//soma.out".into()) });
        let message = e.to_string();
        assert!(message.contains("SOMA_STATS=\"/tmp/soma.out\" and SOMA_TRACE=\"/tmp//soma.out\""), "{message}");
        assert!(message.contains("accepted: two different files"), "{message}");
        assert!(config(&[("SOMA_STATS", "/tmp/soma.stats"), ("SOMA_TRACE", "/tmp/soma.csv")]).is_ok());
        assert!(config(&[("SOMA_STATS", "1"), ("SOMA_TRACE", "/tmp/soma.csv")]).is_ok());
        for other in ["SOMA_STATS", "SOMA_TRACE"] {
            let e = config(&[(other, "/tmp/x.out"), ("SOMA_SNAPSHOT", "/tmp/./x.out")]).unwrap_err();
            assert_eq!(e, ConfigError::SameFile { first: (other, "/tmp/x.out".into()), second: ("SOMA_SNAPSHOT", "/tmp/./x.out".into()) });
        }
    }

    #[test]
    fn only_ascii_whitespace_is_trimmed() {
        assert!(config(&[("SOMA_DISABLE", " 1\t")]).unwrap().disable);
        assert_eq!(config(&[("SOMA_PENDING_FREE_LIMIT", " 4 MiB ")]).unwrap().pending_free_limit, Bytes::Exact(4 << 20));
        for value in ["\u{a0}1", "1\u{2003}", "\u{3000}4MiB"] {
            let variable = if value.ends_with("MiB") { "SOMA_MAX_BYTES" } else { "SOMA_DISABLE" };
            assert_eq!(blamed(config(&[(variable, value)]).unwrap_err()), variable, "{value:?}");
        }
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4 GB"), Some(4 << 30));
        assert_eq!(parse_size("1tib"), Some(1 << 40));
        assert_eq!(parse_size("MAX"), Some(u64::MAX));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("99999999999T"), None, "overflow is an error, not a wrap");
    }

    #[test]
    fn threshold_accepts_total_but_max_bytes_does_not() {
        let c = config(&[("SOMA_RELEASE_THRESHOLD", "total")]).unwrap();
        assert_eq!(c.release_threshold, Bytes::DeviceTotal);
        assert_eq!(c.release_threshold.resolve(80 << 30), 80 << 30);
        assert_eq!(blamed(config(&[("SOMA_MAX_BYTES", "total")]).unwrap_err()), "SOMA_MAX_BYTES");
    }

    #[test]
    fn the_decay_is_a_whole_number_of_milliseconds_and_0_is_never() {
        assert_eq!(config(&[("SOMA_DECAY_MS", "0")]).unwrap().decay, None);
        assert_eq!(config(&[("SOMA_DECAY_MS", " 250 ")]).unwrap().decay, Some(std::time::Duration::from_millis(250)));
        assert_eq!(config(&[("SOMA_IDLE_MS", "0")]).unwrap().idle, None);
        assert_eq!(config(&[("SOMA_IDLE_MS", "20")]).unwrap().idle, Some(std::time::Duration::from_millis(20)));
        for bad in ["1s", "-5", "1.5", "", "max"] {
            assert_eq!(blamed(config(&[("SOMA_DECAY_MS", bad)]).unwrap_err()), "SOMA_DECAY_MS", "{bad:?}");
        }
        assert!(!config(&[("SOMA_NEIGHBOURS", "0")]).unwrap().neighbours);
    }

    #[test]
    fn the_memory_limit_is_a_size_or_a_share_of_the_device() {
        let limit = |text| config(&[("SOMA_MEMORY_LIMIT", text)]).map(|c| c.memory_limit);
        assert_eq!(limit("40GiB"), Ok(Bytes::Exact(40 << 30)));
        assert_eq!(limit("max"), Ok(Bytes::Exact(u64::MAX)));
        assert_eq!(limit("50%").unwrap().resolve(80 << 30), 40 << 30);
        assert_eq!(limit("12.5%").unwrap().resolve(80 << 30), 10 << 30);
        assert_eq!(limit(" 100% ").unwrap().resolve(80 << 30), 80 << 30);
        assert_eq!(limit("0.01%").unwrap().resolve(10_000), 1);
        for bad in ["0", "0%", "101%", "%", "-5%", "1.234%", "5 %", "50%%", "total", "half"] {
            let message = config(&[("SOMA_MEMORY_LIMIT", bad)]).unwrap_err().to_string();
            assert!(message.contains("SOMA_MEMORY_LIMIT") && message.contains("50%"), "{bad}: {message}");
        }
    }

    #[test]
    fn every_variable_is_read() {
        let c = config(&[
            ("SOMA_DISABLE", "1"),
            ("SOMA_POOL", "default"),
            ("SOMA_RELEASE_THRESHOLD", "512MiB"),
            ("SOMA_REUSE_FOLLOW_EVENT_DEPS", "on"),
            ("SOMA_REUSE_OPPORTUNISTIC", "false"),
            ("SOMA_REUSE_INTERNAL_DEPS", "yes"),
            ("SOMA_MIN_BYTES", "1KiB"),
            ("SOMA_MAX_BYTES", "1G"),
            ("SOMA_FREE_SYNC", "true"),
            ("SOMA_FREE_ORDER", "barrier"),
            ("SOMA_PENDING_FREE_LIMIT", "1M"),
            ("SOMA_LEGACY_CACHE", "OFF"),
            ("SOMA_MEMORY_LIMIT", "25%"),
            ("SOMA_STATS", "1"),
            ("SOMA_TRACE", "/tmp/t.csv"),
            ("SOMA_MEMINFO", "pool"),
            ("SOMA_PASSTHROUGH_CALLERS", "libnccl, libfoo,"),
            ("SOMA_LOG", "somashim=debug"),
        ])
        .unwrap();
        assert!(c.disable);
        assert_eq!(c.pool, PoolChoice::Default);
        assert_eq!(c.release_threshold, Bytes::Exact(512 << 20));
        assert!(c.reuse_follow_event_deps && !c.reuse_opportunistic && c.reuse_internal_deps);
        assert_eq!((c.min_bytes, c.max_bytes), (1024, 1 << 30));
        assert!(c.free_sync);
        assert_eq!(c.free_order, FreeOrder::Barrier);
        assert_eq!(c.pending_free_limit, Bytes::Exact(1 << 20));
        assert_eq!(c.legacy_cache, LegacyCache::Off);
        assert_eq!(c.memory_limit, Bytes::DeviceShare(2500));
        assert_eq!(c.stats, StatsOutput::Stderr);
        assert_eq!(c.trace.as_deref(), Some("/tmp/t.csv"));
        assert_eq!(c.meminfo, MemInfo::Pool);
        assert_eq!(c.passthrough_callers, vec!["libnccl".to_string(), "libfoo".to_string()]);
        assert_eq!(c.log, "somashim=debug");
        assert_eq!(c.effective.len(), VARIABLES.len());
    }

    #[test]
    fn bad_values_name_the_variable_the_value_and_the_forms() {
        let e = config(&[("SOMA_RELEASE_THRESHOLD", "banana")]).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("SOMA_RELEASE_THRESHOLD"), "{message}");
        assert!(message.contains("banana"), "{message}");
        assert!(message.contains("512MiB") && message.contains("total"), "{message}");
        assert!(config(&[("SOMA_POOL", "mine")]).unwrap_err().to_string().ends_with("accepted: own or default"));
        assert_eq!(blamed(config(&[("SOMA_FREE_SYNC", "2")]).unwrap_err()), "SOMA_FREE_SYNC");
        assert_eq!(blamed(config(&[("SOMA_MEMINFO", "free")]).unwrap_err()), "SOMA_MEMINFO");
    }

    #[test]
    fn size_range_decides_pooling() {
        let c = config(&[("SOMA_MIN_BYTES", "1K"), ("SOMA_MAX_BYTES", "1M")]).unwrap();
        assert!(!c.pools_size(1023));
        assert!(c.pools_size(1024));
        assert!(c.pools_size(1 << 20));
        assert!(!c.pools_size((1 << 20) + 1));
    }
}

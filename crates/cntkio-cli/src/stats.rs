//! `cntkio stats`: per stream and dimension, the mean, standard deviation, minimum and maximum of the values
//! ([`cntkio::stats`]), as text or JSON.

use crate::args::StatsArgs;
use crate::output::Progress;
use crate::EXIT_OK;
use cntkio::stats::{StatsReport, StreamStats};
use cntkio::Error;

/// Runs `stats`.
pub fn run(a: &StatsArgs, quiet: bool) -> Result<u8, Error> {
    let jobs = a.read.jobs(&a.files)?;
    let source = cntkio::inputs::open_all(&jobs, a.read.mapping(), a.read.threads())?;
    let progress = Progress::chunks(source.chunks().len() as u64, "reading", quiet);
    let report = cntkio::stats::stats(&*source, a.read.threads(), &mut |done, _| progress.set(done as u64), None);
    progress.finish();
    let report = report?;
    if a.json {
        out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
    } else {
        let names: Vec<String> = jobs.iter().map(|j| j.path().display().to_string()).collect();
        text(&names.join(", "), &report, a.dims)?;
    }
    Ok(EXIT_OK)
}

/// The smallest and largest of `v`'s numbers (NaN left out), if any.
fn range(v: &[f64]) -> Option<(f64, f64)> {
    v.iter().filter(|x| !x.is_nan()).fold(None, |r, &x| match r {
        None => Some((x, x)),
        Some((a, b)) => Some((a.min(x), b.max(x))),
    })
}

/// A figure in a column of 12: six significant digits, exponent form where they would not show.
fn fig(x: f64) -> String {
    if x.is_nan() {
        return format!("{:>12}", "-");
    }
    let a = x.abs();
    if a != 0.0 && !(1e-3..1e7).contains(&a) {
        format!("{x:>12.5e}")
    } else {
        format!("{x:>12.6}")
    }
}

fn row(dim: usize, s: &StreamStats, extra: &str) -> Result<(), Error> {
    out!("  {dim:>8} {}{}{}{}{extra}", fig(s.mean[dim]), fig(s.std[dim]), fig(s.min[dim]), fig(s.max[dim]))
}

fn text(inputs: &str, r: &StatsReport, dims: usize) -> Result<(), Error> {
    out!("{inputs}: {} sequences", r.sequences)?;
    for s in &r.streams {
        let entries = match s.entries {
            Some(e) if s.samples > 0 => format!("   entries {e} ({:.2} a sample)", e as f64 / s.samples as f64),
            Some(e) => format!("   entries {e}"),
            None => String::new(),
        };
        out!("{}   {}   dim {}   samples {}{entries}", s.name, s.format, s.dim, s.samples)?;
        if s.nan + s.infinite > 0 {
            out!("  NaN values {}, infinite values {}: the figures of their dimensions are too", s.nan, s.infinite)?;
        }
        if s.samples == 0 {
            continue;
        }
        if let (Some((lo, hi)), Some((min, _)), Some((_, max))) = (range(&s.mean), range(&s.min), range(&s.max)) {
            let constant = s.std.iter().filter(|&&x| x == 0.0).count();
            out!(
                "  over its dims: means from {} to {}, values from {} to {}; {constant} dim(s) constant",
                fig(lo).trim(),
                fig(hi).trim(),
                fig(min).trim(),
                fig(max).trim()
            )?;
        }
        let per_index = s.entries_per_index.as_deref();
        out!(
            "  {:>8} {:>12}{:>12}{:>12}{:>12}{}",
            if per_index.is_some() { "index" } else { "dim" },
            "mean",
            "std",
            "min",
            "max",
            if per_index.is_some() { "     entries" } else { "" }
        )?;
        match per_index {
            Some(counts) => {
                // The indices with the most entries (for one-hot labels: the largest classes).
                let mut order: Vec<usize> = (0..s.dim).filter(|&i| counts[i] > 0).collect();
                order.sort_by_key(|&i| (std::cmp::Reverse(counts[i]), i));
                for &i in order.iter().take(dims) {
                    let share = 100.0 * counts[i] as f64 / s.samples as f64;
                    row(i, s, &format!("{:>12} ({share:.1} % of samples)", counts[i]))?;
                }
                if order.len() > dims {
                    out!("  … {} more indices with entries (--dims N, or --json for all)", order.len() - dims)?;
                }
            }
            None => {
                for d in 0..s.dim.min(dims) {
                    row(d, s, "")?;
                }
                if s.dim > dims {
                    out!("  … {} more dims (--dims N, or --json for all)", s.dim - dims)?;
                }
            }
        }
    }
    Ok(())
}

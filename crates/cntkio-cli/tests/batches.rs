//! `cntkio batches`: the worked example of READER.md §3.6, checkpoint → restore, workers, errors.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn cntkio(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_cntkio")).args(args).output().expect("run cntkio");
    (o.status.code().unwrap_or(-1), String::from_utf8(o.stdout).unwrap(), String::from_utf8(o.stderr).unwrap())
}

fn lines(s: &str) -> Vec<Value> {
    s.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn keys(v: &Value, stream: &str) -> Vec<u64> {
    v["streams"][stream]["keys"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap()).collect()
}

fn twenty(dir: &Path) -> String {
    let text: String = (0..20).map(|i| format!("{i} |a {i} {} |b {}:1\n", -i, i % 4)).collect();
    let p = dir.join("twenty.ctf");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

const STREAMS: [&str; 6] = ["-s", "a:2:dense", "-s", "b:4:sparse", "--chunk-size", "64"];

#[test]
fn worked_example() {
    let dir = tempfile::tempdir().unwrap();
    let f = twenty(dir.path());
    let mut args = vec!["batches", f.as_str(), "--mb-size", "5", "--randomize"];
    args.extend(STREAMS);
    let (code, out, err) = cntkio(&args);
    assert_eq!(code, 0, "{err}");
    let l = lines(&out);
    assert_eq!(l.len(), 4);
    let want: [&[u64]; 4] = [&[9, 13, 7, 12, 17], &[14, 16, 1, 2, 4], &[18, 10, 8, 15, 3], &[11, 19, 5, 0, 6]];
    for (i, (v, w)) in l.iter().zip(want).enumerate() {
        assert_eq!(v["mb"], i as u64);
        assert_eq!(keys(v, "a"), w);
        assert_eq!(keys(v, "b"), w);
        assert_eq!(v["sweep_end"], i == 3);
    }
    // Samples as in `dump`: sequence 9 is `|a 9 -9 |b 1:1`.
    assert_eq!(l[0]["streams"]["a"]["sequences"][0].to_string(), "[[9,-9]]");
    assert_eq!(l[0]["streams"]["b"]["sequences"][0].to_string(), "[[[1,1]]]");
}

#[test]
fn checkpoint_and_restore_continue_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let f = twenty(dir.path());
    let mut base = vec!["batches", f.as_str(), "--mb-size", "3", "--randomize", "--seed", "5", "--window-chunks", "2"];
    base.extend(STREAMS);
    base.extend(["--max-sweeps", "3"]);
    let (code, full, err) = cntkio(&base);
    assert_eq!(code, 0, "{err}");
    let mut a = base.clone();
    a.extend(["--checkpoint-after", "7"]);
    let (_, first, _) = cntkio(&a);
    let fl = lines(&first);
    assert_eq!(fl[7]["state"]["version"], 1);
    let state = dir.path().join("state.jsonl");
    std::fs::write(&state, &first).unwrap();
    let mut r = base.clone();
    r.extend(["--restore", state.to_str().unwrap()]);
    let (code, rest, err) = cntkio(&r);
    assert_eq!(code, 0, "{err}");
    let full = lines(&full);
    assert_eq!(lines(&rest), full[7..]);
    let mut without_state = fl.clone();
    without_state.remove(7);
    assert_eq!(without_state, full);
}

#[test]
fn workers_split_the_data_and_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let f = twenty(dir.path());
    let mut all = Vec::new();
    for rank in ["0", "1", "2"] {
        let mut a = vec!["batches", f.as_str(), "--mb-size", "4", "--randomize", "--workers", "3", "--rank", rank];
        a.extend(STREAMS);
        let (code, out, err) = cntkio(&a);
        assert_eq!(code, 0, "{err}");
        for l in lines(&out) {
            all.extend(keys(&l, "a"));
        }
    }
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<u64>>());
    let mut a = vec!["batches", f.as_str(), "--mb-size", "0"];
    a.extend(STREAMS);
    assert_eq!(cntkio(&a).0, 2);
    let mut a = vec!["batches", f.as_str(), "--mb-size", "2", "--max-sweeps", "1", "--max-samples", "3"];
    a.extend(STREAMS);
    assert_eq!(cntkio(&a).0, 2);
}

/// `--balanced-workers`: the single worker's randomized order dealt sequence by sequence — here 8 workers
/// over 7 chunks, where CNTK's chunk dealing leaves the last worker without data.
#[test]
fn balanced_workers_deal_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let f = twenty(dir.path());
    let run = |extra: &[&str]| -> Vec<u64> {
        let mut a = vec!["batches", f.as_str(), "--mb-size", "3", "--randomize", "--seed", "2"];
        a.extend(STREAMS);
        a.extend(extra);
        let (code, out, err) = cntkio(&a);
        assert_eq!(code, 0, "{err}");
        lines(&out).iter().flat_map(|l| keys(l, "a")).collect()
    };
    let order = run(&[]);
    assert_eq!(order.len(), 20);
    for rank in 0..8 {
        let r = rank.to_string();
        let got = run(&["--workers", "8", "--rank", r.as_str(), "--balanced-workers"]);
        let want: Vec<u64> = order.iter().skip(rank).step_by(8).copied().collect();
        assert_eq!(got, want, "rank {rank}");
    }
    assert!(run(&["--workers", "8", "--rank", "7"]).is_empty());
}

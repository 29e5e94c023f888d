//! docs/walkthrough.md cannot drift from the program: every `$ roce-xdp ...` command in
//! a ```console block is run from the project's root, and its output must be exactly
//! the ```text block that follows. `ROCE_UPDATE_DOCS=1 cargo test --test walkthrough`
//! rewrites those blocks from what the commands print now.

use std::path::Path;
use std::process::Command;

/// One command of the document: the line index of its output block and the command.
struct Step {
    args: Vec<String>,
    /// Lines [start, end) of the text block holding its output (fences excluded).
    out: (usize, usize),
}

fn steps(lines: &[&str]) -> Vec<Step> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "```console" {
            let cmd = lines[i + 1].strip_prefix("$ roce-xdp ").unwrap_or_else(|| {
                panic!("line {}: a console block starts with `$ roce-xdp `", i + 2)
            });
            let args = cmd.split_whitespace().map(str::to_string).collect();
            assert_eq!(
                lines[i + 2].trim(),
                "```",
                "line {}: one command per block",
                i + 3
            );
            assert_eq!(
                lines[i + 3].trim(),
                "```text",
                "line {}: its output follows",
                i + 4
            );
            let start = i + 4;
            let mut end = start;
            while lines[end].trim() != "```" {
                end += 1;
            }
            v.push(Step {
                args,
                out: (start, end),
            });
            i = end;
        }
        i += 1;
    }
    v
}

#[test]
fn walkthrough_outputs_are_what_the_commands_print() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("docs/walkthrough.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = doc.lines().collect();
    let steps = steps(&lines);
    assert!(steps.len() >= 8, "{} commands", steps.len());
    let update = std::env::var("ROCE_UPDATE_DOCS").as_deref() == Ok("1");
    let mut new: Vec<String> = Vec::new();
    let mut at = 0;
    let mut stale = Vec::new();
    for s in &steps {
        let o = Command::new(env!("CARGO_BIN_EXE_roce-xdp"))
            .args(&s.args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            o.status.success() || s.args.iter().any(|a| a == "--check"),
            "{:?}: {}",
            s.args,
            String::from_utf8_lossy(&o.stderr)
        );
        let got = String::from_utf8(o.stdout).unwrap();
        let got: Vec<&str> = got.trim_end_matches('\n').lines().collect();
        let want = &lines[s.out.0..s.out.1];
        if got != want {
            stale.push(format!("roce-xdp {}", s.args.join(" ")));
        }
        new.extend(lines[at..s.out.0].iter().map(|l| l.to_string()));
        new.extend(got.iter().map(|l| l.to_string()));
        at = s.out.1;
    }
    new.extend(lines[at..].iter().map(|l| l.to_string()));
    if update {
        std::fs::write(&path, new.join("\n") + "\n").unwrap();
        println!(
            "rewrote {} ({} outputs changed)",
            path.display(),
            stale.len()
        );
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/walkthrough.md shows other output than these commands print now \
         (ROCE_UPDATE_DOCS=1 cargo test --test walkthrough rewrites it): {stale:#?}"
    );
}

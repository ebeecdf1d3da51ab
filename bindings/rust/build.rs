// Links liblbopt: from $LBOPT_LIB_DIR (a build directory), else from pkg-config's lbopt.pc, else the system.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LBOPT_LIB_DIR");
    let mut dirs = Vec::new();
    if let Ok(dir) = std::env::var("LBOPT_LIB_DIR") {
        dirs.push(dir);
    } else if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "lbopt"]).output() {
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        dirs.extend(text.split_whitespace().filter_map(|f| f.strip_prefix("-L")).map(str::to_string));
    }
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    println!("cargo:rustc-link-lib=dylib=lbopt");
}

//! `stripefs`: run a stripefs cluster and use it.
//!
//! Paths inside stripefs are written `sfs:/dir/file` (plain `/dir/file` is accepted where no
//! local path can be meant); `cp` uses the prefix to tell a stripefs path from a local one.
//! Client commands find the cluster file in `--cluster`, `$STRIPEFS_CLUSTER`, or
//! `./stripefs-data/cluster.toml` (what `stripefs serve --io-servers N` writes; `stripefs init`
//! writes the file of a cluster on several hosts).
#![forbid(unsafe_code)]

mod cli;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "stripefs", version, about = "A compact PVFS-style striped file system on ionet")]
struct Cli {
    /// The cluster file (default: $STRIPEFS_CLUSTER, then ./stripefs-data/cluster.toml).
    #[arg(long, global = true, env = "STRIPEFS_CLUSTER")]
    cluster: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start 1 meta + 4 io servers locally, write and read back a file over each transport,
    /// print a side-by-side table, clean up.
    Demo(cli::demo::DemoArgs),
    /// Write the cluster file (and a new cluster key) of a cluster of several hosts: the meta
    /// server's and the io servers' addresses; prints what to copy to which host and the
    /// command each host runs.
    Init(cli::init::InitArgs),
    /// Run servers: one io server (--io I), the meta server (--meta), or a whole local cluster
    /// (which starts a server that dies again). On a cluster of several hosts each host runs
    /// its own: `serve --meta --cluster FILE` or `serve --io I --cluster FILE`.
    Serve(cli::serve::ServeArgs),
    /// Copy a file (with -r, a directory tree) between the local file system and stripefs
    /// (sfs:/path), either way, or within stripefs.
    Cp(cli::cp::CpArgs),
    /// List a directory.
    Ls(cli::listing::LsArgs),
    /// Attributes, logical size and layout of a path (of a symbolic link itself, and its
    /// target, unless -L).
    Stat {
        /// Follow a symbolic link in the last component.
        #[arg(short = 'L', long)]
        dereference: bool,
        /// The path.
        path: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Create a hard link LINK to TARGET (a further name of one file), or with -s a symbolic
    /// link LINK pointing at TARGET.
    Ln {
        /// Make a symbolic link.
        #[arg(short, long)]
        symbolic: bool,
        /// A hard link's file (a symbolic link there is linked itself); a symbolic link's
        /// target, stored as given (absolute targets start at the stripefs root when stripefs
        /// follows them, at the mount's host root through a FUSE mount).
        target: String,
        /// The link to create.
        link: String,
    },
    /// Print a symbolic link's target.
    Readlink {
        /// The link.
        path: String,
    },
    /// Remove files, symbolic links and empty directories (with -r, directories and what is
    /// below them; links are removed, never followed).
    Rm {
        /// Remove directories and everything below them.
        #[arg(short, long)]
        recursive: bool,
        /// The paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename a file or directory within stripefs (into a directory: keeping its name).
    Mv {
        /// What to rename.
        src: String,
        /// Its new path, or an existing directory to move it into.
        dst: String,
    },
    /// Create a directory.
    Mkdir {
        /// Create missing parents too.
        #[arg(short, long)]
        parents: bool,
        /// The paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show a file's layout or a directory's default layout.
    Getstripe {
        /// The path.
        path: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Set a directory's default layout, or create an empty file with a layout.
    Setstripe(cli::cmds::SetstripeArgs),
    /// Each io server's counters: requests, bytes, errors, and the data path (mapped or
    /// copying, with the reasons for copying) they took.
    Servers {
        /// Print one JSON document instead of text (see the README's Scripting section).
        #[arg(long)]
        json: bool,
    },
    /// Size, used and available space of each io server's file system and their sum, and the
    /// number of files and directories.
    Df {
        #[command(flatten)]
        out: cli::Output,
    },
    /// Whether every server of the cluster is up: the meta server and each io server with its
    /// version, uptime, requests served and in flight, and the space of its data directory.
    /// Exits 1 if any server is down, naming it.
    Status {
        #[command(flatten)]
        out: cli::Output,
    },
    /// Mount stripefs with FUSE, in the foreground (or with --background, returning once the
    /// mount is live).
    #[command(hide = cfg!(not(feature = "fuse")))]
    Mount(cli::mount::MountArgs),
}

fn main() -> ExitCode {
    let cli = match invoked_as_mount_helper() {
        // As `/sbin/mount.stripefs`, mount(8) runs it for `mount -t stripefs` and fstab.
        true => match cli::mount::helper_command_line(cli::mount::HelperArgs::parse()) {
            Ok(Some(line)) => Cli::parse_from(line),
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{}: {}", cli::mount::HELPER_NAME, cli::error_line(&e));
                return ExitCode::FAILURE;
            }
        },
        false => Cli::parse(),
    };
    cli::init_tracing();
    let cluster = cli.cluster;
    let r = match cli.cmd {
        Cmd::Demo(a) => cli::demo::run(a),
        Cmd::Init(a) => cli::init::run(a),
        Cmd::Serve(a) => cli::serve::run(a, cluster),
        Cmd::Cp(a) => cli::cp::cp(cluster, a),
        Cmd::Ls(a) => cli::listing::ls(cluster, a),
        Cmd::Stat { dereference, path, out } => cli::listing::stat(cluster, &path, dereference, out),
        Cmd::Ln { symbolic, target, link } => cli::cmds::ln(cluster, symbolic, &target, &link),
        Cmd::Readlink { path } => cli::cmds::readlink(cluster, &path),
        Cmd::Rm { recursive, paths } => cli::cmds::rm(cluster, recursive, &paths),
        Cmd::Mv { src, dst } => cli::cmds::mv(cluster, &src, &dst),
        Cmd::Mkdir { parents, paths } => cli::cmds::mkdir(cluster, parents, &paths),
        Cmd::Getstripe { path, out } => cli::cmds::getstripe(cluster, &path, out),
        Cmd::Setstripe(a) => cli::cmds::setstripe(cluster, a),
        Cmd::Servers { json } => cli::cmds::servers(cluster, json),
        Cmd::Df { out } => cli::cmds::df(cluster, out),
        Cmd::Status { out } => cli::status::status(cluster, out),
        Cmd::Mount(a) => cli::mount::mount(cluster, a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stripefs: {}", cli::error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Whether this binary runs under the mount helper's name (a link to it).
fn invoked_as_mount_helper() -> bool {
    let argv0 = std::env::args_os().next().map(PathBuf::from);
    argv0.and_then(|p| p.file_name().map(|n| n == cli::mount::HELPER_NAME)).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks (duplicate short flags, conflicting names, …).
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// `mount` is in the help only where it can work.
    #[test]
    fn mount_is_listed_only_with_fuse() {
        use clap::CommandFactory;
        let cmd = super::Cli::command();
        let mount = cmd.find_subcommand("mount").expect("mount parses in every build");
        assert_eq!(mount.is_hide_set(), cfg!(not(feature = "fuse")));
    }
}

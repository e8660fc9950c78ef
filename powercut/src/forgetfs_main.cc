// fencelock-forgetfs: the forgetful file system (powercut/forgetful_fs.h) mounted with FUSE.
//
//   fencelock-forgetfs --store=DIR --control=SOCKET MOUNTPOINT   mounts, serves until SIGTERM
//   fencelock-forgetfs ctl SOCKET cut drop|keep-some|tear-sector|tear-page [seed=N]
//   fencelock-forgetfs ctl SOCKET stats
//
// Every operation on MOUNTPOINT goes to DIR/live; what a power cut would leave is kept in
// DIR/durable. The kernel is told to cache nothing (attributes, names, or data across opens),
// so that after a cut every process sees what survived. Needs /dev/fuse (and root, or
// fusermount3).
#include <fuse3/fuse.h>
#include <fuse3/fuse_lowlevel.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "logging/logging.h"
#include "powercut/control.h"
#include "powercut/forgetful_fs.h"
#include "process/flags.h"

ABSL_FLAG(std::string, store, "",
          "the folder behind the mount: STORE/live holds what the mount shows, STORE/durable what "
          "a power cut would leave (created if missing; what live holds at the start is durable)");
ABSL_FLAG(std::string, control, "", "the Unix socket that takes \"cut ...\" and \"stats\"");

namespace fencelock::powercut {
namespace {

ForgetfulFs* g_fs = nullptr;

ForgetfulFs& Fs() { return *g_fs; }

void* Init(fuse_conn_info*, fuse_config* cfg) {
  // Nothing cached in the kernel: after a cut, names, sizes and data are read again.
  cfg->entry_timeout = 0;
  cfg->attr_timeout = 0;
  cfg->negative_timeout = 0;
  cfg->kernel_cache = 0;
  cfg->direct_io = 0;  // mmap (SQLite's -shm) needs the page cache, invalidated at each open
  cfg->hard_remove = 1;  // unlink removes the name at once; open handles keep the file
  cfg->use_ino = 0;
  return nullptr;
}

int GetAttr(const char* path, struct stat* st, fuse_file_info* fi) {
  return fi != nullptr ? Fs().FGetAttr(fi->fh, st) : Fs().GetAttr(path, st);
}

int ReadDir(const char* path, void* buf, fuse_fill_dir_t filler, off_t, fuse_file_info*,
            fuse_readdir_flags) {
  std::vector<std::string> names;
  if (const int r = Fs().ReadDir(path, &names); r != 0) return r;
  for (const std::string& name : names) filler(buf, name.c_str(), nullptr, 0, fuse_fill_dir_flags{});
  return 0;
}

int Mkdir(const char* path, mode_t mode) { return Fs().Mkdir(path, mode); }
int Rmdir(const char* path) { return Fs().Rmdir(path); }
int Unlink(const char* path) { return Fs().Unlink(path); }
int Rename(const char* from, const char* to, unsigned int flags) {
  return Fs().Rename(from, to, flags);
}

int Create(const char* path, mode_t mode, fuse_file_info* fi) {
  uint64_t handle = 0;
  const int r = Fs().Create(path, mode, fi->flags, &handle);
  if (r == 0) fi->fh = handle;
  return r;
}

int Open(const char* path, fuse_file_info* fi) {
  uint64_t handle = 0;
  const int r = Fs().Open(path, fi->flags, &handle);
  if (r == 0) fi->fh = handle;
  return r;
}

int Read(const char*, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  return Fs().Read(fi->fh, buf, size, offset);
}

int Write(const char*, const char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  return Fs().Write(fi->fh, buf, size, offset);
}

int Truncate(const char* path, off_t size, fuse_file_info* fi) {
  return fi != nullptr ? Fs().FTruncate(fi->fh, size) : Fs().Truncate(path, size);
}

int Fallocate(const char*, int mode, off_t offset, off_t length, fuse_file_info* fi) {
  return Fs().Fallocate(fi->fh, mode, offset, length);
}

int Fsync(const char*, int, fuse_file_info* fi) { return Fs().Fsync(fi->fh); }
int FsyncDir(const char* path, int, fuse_file_info*) { return Fs().FsyncDir(path); }
int Flush(const char*, fuse_file_info*) { return 0; }
int Release(const char*, fuse_file_info* fi) { return Fs().Release(fi->fh); }
int Chmod(const char* path, mode_t mode, fuse_file_info*) { return Fs().Chmod(path, mode); }
int Chown(const char* path, uid_t uid, gid_t gid, fuse_file_info*) {
  return Fs().Chown(path, uid, gid);
}
int Utimens(const char* path, const timespec times[2], fuse_file_info*) {
  return Fs().Utimens(path, times);
}
int Statfs(const char*, struct statvfs* st) { return Fs().Statfs(st); }

// What the model does not know is refused, loudly.
int Symlink(const char* target, const char* path) {
  return Fs().Refuse(absl::StrCat("symlink ", path, " -> ", target));
}
int Link(const char* from, const char* to) {
  return Fs().Refuse(absl::StrCat("hard link ", to, " to ", from));
}
int Mknod(const char* path, mode_t mode, dev_t) {
  return Fs().Refuse(absl::StrCat("mknod ", path, " mode ", mode));
}
int SetXattr(const char* path, const char* name, const char*, size_t, int) {
  return Fs().Refuse(absl::StrCat("setxattr ", name, " on ", path));
}
int GetXattr(const char*, const char*, char*, size_t) { return -ENOTSUP; }

fuse_operations Operations() {
  fuse_operations ops{};
  ops.init = Init;
  ops.getattr = GetAttr;
  ops.readdir = ReadDir;
  ops.mkdir = Mkdir;
  ops.rmdir = Rmdir;
  ops.unlink = Unlink;
  ops.rename = Rename;
  ops.create = Create;
  ops.open = Open;
  ops.read = Read;
  ops.write = Write;
  ops.truncate = Truncate;
  ops.fallocate = Fallocate;
  ops.fsync = Fsync;
  ops.fsyncdir = FsyncDir;
  ops.flush = Flush;
  ops.release = Release;
  ops.chmod = Chmod;
  ops.chown = Chown;
  ops.utimens = Utimens;
  ops.statfs = Statfs;
  ops.symlink = Symlink;
  ops.link = Link;
  ops.mknod = Mknod;
  ops.setxattr = SetXattr;
  ops.getxattr = GetXattr;
  return ops;
}

// Answers the control socket, one command per connection, until `stop`.
void ServeControl(int listener, const std::atomic<bool>& stop) {
  while (!stop) {
    const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;  // the listener is shut down at exit
    std::string line;
    char buf[256];
    while (line.find('\n') == std::string::npos && line.size() < 4096) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    if (const size_t end = line.find('\n'); end != std::string::npos) {
      line.resize(end);
      const std::string answer = Answer(Fs(), line, absl::Seconds(10)) + "\n";
      (void)send(conn, answer.data(), answer.size(), MSG_NOSIGNAL);
    }
    close(conn);
  }
}

int ListenControl(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) return -1;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 8) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

int Ctl(const std::vector<std::string>& args) {
  if (args.size() < 3) {
    std::fprintf(stderr, "usage: fencelock-forgetfs ctl SOCKET cut MODE [seed=N] | stats\n");
    return 2;
  }
  std::vector<std::string> words(args.begin() + 2, args.end());
  auto answer = Control(args[1], absl::StrJoin(words, " "));
  if (!answer.ok()) {
    logging::Program().Error(std::string(answer.status().message()));
    return 1;
  }
  std::printf("%s\n", answer->c_str());
  return 0;
}

int Main(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "ctl") return Ctl(args);
  const std::string store = absl::GetFlag(FLAGS_store);
  const std::string control = absl::GetFlag(FLAGS_control);
  if (args.size() != 1 || store.empty() || control.empty()) {
    std::fprintf(stderr,
                 "usage: fencelock-forgetfs --store=DIR --control=SOCKET MOUNTPOINT\n"
                 "       fencelock-forgetfs ctl SOCKET cut drop|keep-some|tear-sector|tear-page "
                 "[seed=N] | stats\n");
    return 2;
  }
  auto fs = ForgetfulFs::Open(store);
  if (!fs.ok()) {
    logging::Program().Error(std::string(fs.status().message()));
    return 1;
  }
  g_fs = fs->get();
  const int listener = ListenControl(control);
  if (listener < 0) {
    logging::Program().Error(absl::StrFormat(
        "cannot listen on %s: %s", control.c_str(), std::strerror(errno)));
    return 1;
  }
  const fuse_operations ops = Operations();
  std::vector<std::string> fuse_args = {"fencelock-forgetfs", "-o", "fsname=forgetfs,subtype=forgetfs"};
  std::vector<char*> argv;
  for (std::string& a : fuse_args) argv.push_back(a.data());
  struct fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse* f = fuse_new(&fargs, &ops, sizeof(ops), nullptr);
  if (f == nullptr) {
    logging::Program().Error("fuse_new failed");
    return 1;
  }
  if (fuse_mount(f, args[0].c_str()) != 0) {
    logging::Program().Error(absl::StrFormat(
        "cannot mount on %s (is /dev/fuse there, and are we root?)", args[0].c_str()));
    fuse_destroy(f);
    return 1;
  }
  fuse_set_signal_handlers(fuse_get_session(f));
  std::atomic<bool> stop{false};
  std::thread control_thread([&] { ServeControl(listener, stop); });
  logging::Program().Info(absl::StrFormat(
      "%s mounted on %s, control on %s", store.c_str(), args[0].c_str(), control.c_str()));
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, 16);
  const int result = fuse_loop_mt(f, config);
  fuse_loop_cfg_destroy(config);
  stop = true;
  shutdown(listener, SHUT_RDWR);
  control_thread.join();
  close(listener);
  unlink(control.c_str());
  fuse_remove_signal_handlers(fuse_get_session(f));
  fuse_unmount(f);
  fuse_destroy(f);
  return result == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fencelock::powercut

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("fencelock-forgetfs");
  std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  args.erase(args.begin());  // argv[0]
  return fencelock::powercut::Main(args);
}

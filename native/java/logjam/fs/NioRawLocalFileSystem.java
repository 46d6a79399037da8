/*
 * Hadoop's raw local filesystem without its shell-outs.
 *
 * Without libhadoop (pyspark ships none), RawLocalFileSystem runs `chmod` in a child
 * process for every directory and file it creates, `ls -ld` the first time anyone asks a
 * status for its permission, owner or group, `readlink` for every link status, and
 * `chown` to change owners. On a small machine each fork costs 15-25 ms of a JVM with a
 * big heap, which made every new partition of the table cost ~25 ms (docs/operations.md).
 * This class answers the same calls with java.nio: a chmod(2) or stat(2) in-process.
 * Creation, rename and delete are Hadoop's own, so commit semantics do not change.
 */
package logjam.fs;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.NotDirectoryException;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.UserPrincipalLookupService;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final LinkOption[] FOLLOW = new LinkOption[0];
  private static final LinkOption[] NOFOLLOW = {LinkOption.NOFOLLOW_LINKS};
  // PosixFilePermission's constants run owner r,w,x, group r,w,x, others r,w,x: mode bits 8 down to 0.
  private static final PosixFilePermission[] BITS = PosixFilePermission.values();

  private long blockSize;

  @Override
  public void initialize(URI uri, Configuration conf) throws IOException {
    super.initialize(uri, conf);
    blockSize = getDefaultBlockSize(new Path(uri));
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      // java.nio cannot express the sticky bit; nothing of ours asks for it, so the fork is rare.
      super.setPermission(p, permission);
      return;
    }
    try {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), toPosix(permission.toShort()));
    } catch (NoSuchFileException | NotDirectoryException e) {
      throw new FileNotFoundException("File " + p + " does not exist");
    }
  }

  @Override
  public void setOwner(Path p, String username, String groupname) throws IOException {
    if (username == null && groupname == null) {
      throw new IOException("username == null && groupname == null");
    }
    java.nio.file.Path target = pathToFile(p).toPath();
    PosixFileAttributeView view = Files.getFileAttributeView(target, PosixFileAttributeView.class);
    UserPrincipalLookupService names = target.getFileSystem().getUserPrincipalLookupService();
    try {
      if (username != null && !username.isEmpty()) {
        view.setOwner(names.lookupPrincipalByName(username));
      }
      if (groupname != null && !groupname.isEmpty()) {
        view.setGroup(names.lookupPrincipalByGroupName(groupname));
      }
    } catch (NoSuchFileException | NotDirectoryException e) {
      throw new FileNotFoundException("File " + p + " does not exist");
    }
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    File file = pathToFile(f);
    return new NioFileStatus(attributes(file, f, FOLLOW), blockSize, qualified(file));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    File file = pathToFile(f);
    PosixFileAttributes attrs = attributes(file, f, NOFOLLOW);
    if (attrs.isSymbolicLink()) {
      // Hadoop's answer qualifies the link target its own way; links are rare in a warehouse.
      return super.getFileLinkStatus(f);
    }
    return new NioFileStatus(attrs, blockSize, qualified(file));
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    FileStatus status = getFileStatus(f);
    if (!status.isDirectory()) {
      // Hadoop builds this one status itself, bypassing getFileStatus.
      return new FileStatus[] {status};
    }
    return super.listStatus(f);  // each child's status comes from getFileStatus above
  }

  private Path qualified(File file) {
    return new Path(file.getPath()).makeQualified(getUri(), getWorkingDirectory());
  }

  private static PosixFileAttributes attributes(File file, Path f, LinkOption[] options) throws IOException {
    try {
      return Files.readAttributes(file.toPath(), PosixFileAttributes.class, options);
    } catch (NoSuchFileException | NotDirectoryException e) {
      // Hadoop's callers test for FileNotFoundException, as File.exists() made them.
      throw new FileNotFoundException("File " + f + " does not exist");
    }
  }

  static Set<PosixFilePermission> toPosix(int mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << (8 - i))) != 0) {
        set.add(BITS[i]);
      }
    }
    return set;
  }

  static short toMode(Set<PosixFilePermission> set) {
    int mode = 0;
    for (PosixFilePermission bit : set) {
      mode |= 1 << (8 - bit.ordinal());
    }
    return (short) mode;
  }
}

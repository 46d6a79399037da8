/*
 * A file status from one stat(2): sizes and times at once, permission, owner and group
 * (a passwd/group lookup each) only when someone asks, as Hadoop's own local status does.
 */
package logjam.fs;

import java.io.DataOutput;
import java.io.IOException;
import java.io.ObjectStreamException;
import java.nio.file.attribute.PosixFileAttributes;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;

final class NioFileStatus extends FileStatus {
  private static final long serialVersionUID = 1L;

  // Null once permission, owner and group are copied into the FileStatus fields.
  private transient PosixFileAttributes attrs;

  NioFileStatus(PosixFileAttributes attrs, long blockSize, Path path) {
    super(attrs.size(), attrs.isDirectory(), 1, blockSize, attrs.lastModifiedTime().toMillis(),
        attrs.lastAccessTime().toMillis(), null, null, null, path);
    this.attrs = attrs;
  }

  private synchronized void load() {
    PosixFileAttributes a = attrs;
    if (a == null) {
      return;
    }
    setPermission(new FsPermission(NioRawLocalFileSystem.toMode(a.permissions())));
    setOwner(a.owner().getName());
    setGroup(a.group().getName());
    attrs = null;
  }

  @Override
  public FsPermission getPermission() {
    load();
    return super.getPermission();
  }

  @Override
  public String getOwner() {
    load();
    return super.getOwner();
  }

  @Override
  public String getGroup() {
    load();
    return super.getGroup();
  }

  @Override
  @SuppressWarnings("deprecation")  // Hadoop's own statuses still implement it; keep it loaded
  public void write(DataOutput out) throws IOException {
    load();
    super.write(out);
  }

  // Java serialization writes FileStatus's fields before any hook of ours runs: send a plain,
  // loaded copy instead (a Spark executor elsewhere need not have this class).
  private Object writeReplace() throws ObjectStreamException {
    try {
      return new FileStatus(this);
    } catch (IOException e) {
      throw new java.io.InvalidObjectException(e.toString());
    }
  }
}

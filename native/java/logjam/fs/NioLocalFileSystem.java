/*
 * Hadoop's LocalFileSystem (the checksummed one, writing .crc side files) over
 * NioRawLocalFileSystem: for `fs.file.impl` when the .crc files are wanted.
 */
package logjam.fs;

import org.apache.hadoop.fs.LocalFileSystem;

public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}

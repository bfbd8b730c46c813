package io.handoff.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, setting permissions through java.nio instead of a {@code chmod} process.
 *
 * <p>Why: without Hadoop's native library (pyspark ships none), {@link RawLocalFileSystem#setPermission} runs
 * {@code chmod} through {@code Shell.execCommand}, and Hadoop calls it for every file it creates and every directory
 * it makes: a process forked from the driver's or an executor's JVM for each file of a Spark checkpoint on a local
 * path (handoff_spark/startup/local_fs.py). {@code Files.setPosixFilePermissions} makes the same chmod(2) call in
 * this process. A mode with bits beyond the nine rwx bits (sticky, setuid, setgid), which java.nio cannot set, still
 * goes through Hadoop's own way.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  /** The nine permission bits, lowest first: others' x, w, r, then the group's, then the owner's. */
  private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ};

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    int mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        perms.add(BITS[i]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
  }
}

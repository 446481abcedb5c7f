/*
 * Small files remusdbd keeps in its state directory (VM definitions,
 * protection markers, protect settings), one per VM: replaced atomically
 * and durably, removed durably, listed.  A crash or power cut leaves the
 * old file or the new one, never part of one, and a rename or unlink the
 * daemon reported done survives it.  What a file holds is its owner's.
 */
#ifndef REMUSDB_STATE_FILE_H
#define REMUSDB_STATE_FILE_H

#include <stddef.h>

/*
 * Writes text to dir/.file_name.tmp (created mode 0600, dir created when
 * missing), flushes it, renames it over dir/file_name and flushes dir.
 * Returns 0, or -1 with the failing step and path in err (the temporary
 * file removed).
 */
int state_file_replace(const char *dir, const char *file_name, const char *text, char *err,
		       size_t errlen);

/* Removes dir/file_name (already gone is success) and flushes dir. */
int state_file_remove(const char *dir, const char *file_name, char *err, size_t errlen);

/*
 * Calls visit with the stem ("db1" of "db1.json") and the path of each
 * *.json file in dir, skipping hidden files (a replacement's temporary
 * file); nothing when dir does not exist.
 */
void state_file_each_json(const char *dir,
			  void (*visit)(const char *stem, const char *path, void *data),
			  void *data);

#endif

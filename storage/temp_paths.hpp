// storage/temp_paths.hpp — the temporary directories a command has under way (a store being
// written, sorted runs), so that a stop signal can remove them before the process ends (the
// CLI's watcher thread, apps/stop_cleanup.hpp) and a later run can remove those a killed one left.
//
// Temporary names carry the host and the pid: NAME.tmp-HOST-PID-RANDOM style, see temp_name().
#pragma once

#include <filesystem>
#include <mutex>
#include <string>

namespace gale::storage {

// Registers `path` for remove_registered_temps until unregister_temp(path).
void register_temp(const std::filesystem::path& path);
void unregister_temp(const std::filesystem::path& path);

// The lock every change that must not interleave with remove_registered_temps holds: creating
// directories under a registered path, and renaming a finished store into place. Recursive, so
// register_temp / unregister_temp may be called while it is held.
std::unique_lock<std::recursive_mutex> lock_temps();

// Removes every registered path and returns how many there were; `held` must hold lock_temps().
// For the signal watcher, which ends the process right after, still holding the lock.
int remove_registered_temps(std::unique_lock<std::recursive_mutex>& held);

// "<prefix>HOST-PID-<random hex>": a temporary name of this process.
std::string temp_name(const std::string& prefix);

// Removes the entries of `dir` named "<prefix>HOST-PID-..." for this host whose PID is no longer a
// live process: what a killed or crashed run left. Kept while `store` (when given) holds no
// manifest.json: names ending in ".old" and directories holding a manifest.json (a store that a
// crash caught between its renames: the old one moved aside, or the finished new one, perhaps the
// only copy). Once `store` is a store they are only the one it replaced or a run's that never
// finished, and go too. Errors are ignored (best effort).
void remove_stale_temps(const std::filesystem::path& dir, const std::string& prefix,
                        const std::filesystem::path& store = {});

}  // namespace gale::storage

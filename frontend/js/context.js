// The signed-in user's context (name, teams, QoS classes), fetched once per sign-in and shared by the pages.

import { api } from "./api.js";

/**
 * @typedef {{
 *   user: {name: string, is_admin: boolean},
 *   teams: Array<{name: string, role: string | null, qos_classes: string[]}>,
 *   qos_classes: Array<{name: string, priority: number, preemptible: boolean,
 *                       default_max_queue_wait_s: number | null, description: string}>,
 * }} Context
 */

/** @type {Promise<Context> | null} */
let contextPromise = null;

/** @returns {Promise<Context>} */
export function getContext() {
  contextPromise ??= api("/v1/dashboard/context").catch((err) => {
    contextPromise = null;
    throw err;
  });
  return contextPromise;
}

export function resetContext() {
  contextPromise = null;
}

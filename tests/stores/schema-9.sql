BEGIN TRANSACTION;
CREATE TABLE "calibrations" (
   "id" INTEGER PRIMARY KEY,
   "at" REAL,
   "judge" TEXT,
   "model" TEXT,
   "rubric_digest" TEXT,
   "mae" REAL,
   "anchors" INTEGER,
   "threshold" REAL,
   "reliable" INTEGER
);
CREATE TABLE "calls" (
   "id" INTEGER PRIMARY KEY,
   "run_id" TEXT,
   "trial_id" TEXT,
   "at" REAL,
   "provider" TEXT,
   "wire" TEXT,
   "method" TEXT,
   "path" TEXT,
   "model_requested" TEXT,
   "model" TEXT,
   "status" INTEGER,
   "input_tokens" INTEGER,
   "output_tokens" INTEGER,
   "cache_read_tokens" INTEGER,
   "cache_write_tokens" INTEGER,
   "cost" REAL,
   "latency" REAL,
   "ttfb" REAL,
   "request_bytes" INTEGER,
   "response_bytes" INTEGER,
   "error" TEXT,
   "refused" INTEGER,
   "headers" TEXT,
   "role" TEXT
);
CREATE TABLE "events" (
   "id" INTEGER PRIMARY KEY,
   "run_id" TEXT,
   "trial_id" TEXT,
   "at" REAL,
   "kind" TEXT,
   "data" TEXT
);
INSERT INTO "events" VALUES(1,'20260101-000000-0abc',NULL,1.79621641910003829005e+09,'recorded','{"trials": 4}');
INSERT INTO "events" VALUES(2,'20260101-000000-0abc','20260101-000000-0abc.00000',1.79621641911523675918e+09,'finished','{"outcome": "pass"}');
INSERT INTO "events" VALUES(3,'20260101-000000-0abc','20260101-000000-0abc.00001',1.79621641913232350353e+09,'finished','{"outcome": "infra_error"}');
INSERT INTO "events" VALUES(4,'20260101-000000-0abc','20260101-000000-0abc.00002',1.79621641914277982714e+09,'finished','{"outcome": "fail"}');
CREATE TABLE "jobs" (
   "id" TEXT PRIMARY KEY,
   "run_id" TEXT,
   "trial_id" TEXT,
   "state" TEXT,
   "lease_owner" TEXT,
   "lease_expires" REAL,
   "heartbeat_at" REAL,
   "created_at" REAL
);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00000','20260101-000000-0abc','20260101-000000-0abc.00000','done',NULL,1.79621701910489726073e+09,1.7962164191048972607e+09,1.79621641909974193575e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00001','20260101-000000-0abc','20260101-000000-0abc.00001','done',NULL,1796217019.12671,1796216419.12671,1.79621641909974193575e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00002','20260101-000000-0abc','20260101-000000-0abc.00002','done',NULL,1.79621701913808774946e+09,1.79621641913808774947e+09,1.79621641909974193575e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00003','20260101-000000-0abc','20260101-000000-0abc.00003','queued',NULL,NULL,NULL,1.79621641909974193575e+09);
CREATE TABLE "judgments" (
   "id" INTEGER PRIMARY KEY,
   "run_id" TEXT,
   "trial_id" TEXT,
   "judge" TEXT,
   "score" REAL,
   "rationale" TEXT,
   "error" TEXT,
   "calls" INTEGER,
   "input_tokens" INTEGER,
   "output_tokens" INTEGER,
   "cost" REAL,
   "cost_known" INTEGER,
   "duration" REAL
);
CREATE TABLE "meta" (
   "key" TEXT PRIMARY KEY,
   "value" TEXT
);
INSERT INTO "meta" VALUES('schema_version','9');
CREATE TABLE "placements" (
   "trial_id" TEXT PRIMARY KEY,
   "run_id" TEXT,
   "engine" TEXT,
   "address" TEXT,
   "owner" TEXT,
   "at" REAL
);
CREATE TABLE "runs" (
   "id" TEXT PRIMARY KEY,
   "name" TEXT,
   "created_at" REAL,
   "status" TEXT,
   "spec" TEXT,
   "trials_dir" TEXT,
   "schema_version" INTEGER
);
INSERT INTO "runs" VALUES('20260101-000000-0abc','old-run',1.79621641909974193575e+09,'running','{"attempts": 1, "harnesses": {"nop": {}, "oracle": {}}, "name": "old-run"}','/srv/trials',9);
CREATE TABLE "shared_claims" (
   "id" TEXT PRIMARY KEY,
   "run_id" TEXT,
   "kind" TEXT,
   "result" TEXT,
   "trial_id" TEXT,
   "at" REAL
);
CREATE TABLE "shared_jobs" (
   "id" TEXT PRIMARY KEY,
   "run_id" TEXT,
   "kind" TEXT,
   "name" TEXT,
   "seq" INTEGER,
   "data" TEXT,
   "updated_at" REAL
);
CREATE TABLE "shared_locks" (
   "id" TEXT PRIMARY KEY,
   "owner" TEXT,
   "expires_at" REAL
);
CREATE TABLE "steps" (
   "id" INTEGER PRIMARY KEY,
   "run_id" TEXT,
   "trial_id" TEXT,
   "seq" INTEGER,
   "name" TEXT,
   "reward" REAL,
   "rewards" TEXT,
   "exit_code" INTEGER,
   "timed_out" INTEGER,
   "duration" REAL,
   "error" TEXT
);
CREATE TABLE "trials" (
   "id" TEXT PRIMARY KEY,
   "run_id" TEXT,
   "seq" INTEGER,
   "plan_seq" INTEGER,
   "item_id" TEXT,
   "dataset" TEXT,
   "task" TEXT,
   "harness" TEXT,
   "attempt" INTEGER,
   "replaces" TEXT,
   "retries" INTEGER,
   "status" TEXT,
   "outcome" TEXT,
   "reward" REAL,
   "rewards" TEXT,
   "exit_code" INTEGER,
   "error" TEXT,
   "started_at" REAL,
   "finished_at" REAL,
   "duration" REAL,
   "phases" TEXT,
   "trial_dir" TEXT,
   "worker" TEXT,
   "calls" INTEGER,
   "input_tokens" INTEGER,
   "output_tokens" INTEGER,
   "cache_read_tokens" INTEGER,
   "cache_write_tokens" INTEGER,
   "cost" REAL,
   "cost_known" INTEGER,
   "usage_unknown" INTEGER,
   "models" TEXT,
   "other_model_tokens" INTEGER,
   "stopped_by" TEXT,
   "own_report" TEXT,
   "judges" TEXT,
   "error_class" TEXT,
   "engine" TEXT,
   "agent_user" TEXT
);
INSERT INTO "trials" VALUES('20260101-000000-0abc.00000','20260101-000000-0abc',0,0,'ds::alpha[oracle-1]','ds','alpha','oracle',1,NULL,NULL,'finished','pass',1.0,'{"reward": 1.0}',0,NULL,1.7962164191048972607e+09,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "turns": 3}','{}',NULL,NULL,'0:0 (root, image)');
INSERT INTO "trials" VALUES('20260101-000000-0abc.00001','20260101-000000-0abc',1,1,'ds::alpha[nop-1]','ds','alpha','nop',1,NULL,NULL,'finished','infra_error',NULL,'{}',0,'engine down',1796216419.12671,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "turns": 3}','{}','engine_outage',NULL,'0:0 (root, image)');
INSERT INTO "trials" VALUES('20260101-000000-0abc.00002','20260101-000000-0abc',2,2,'ds::beta[oracle-1]','ds','beta','oracle',1,NULL,NULL,'finished','fail',0.0,'{"reward": 0.0}',1,NULL,1.79621641913808774947e+09,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "turns": 3}','{}','partial',NULL,'0:0 (root, image)');
INSERT INTO "trials" VALUES('20260101-000000-0abc.00003','20260101-000000-0abc',3,3,'ds::beta[nop-1]','ds','beta','nop',1,NULL,NULL,'planned',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE INDEX "idx_trials_run_id_plan_seq_seq"
    ON "trials" ("run_id", "plan_seq", "seq");
CREATE INDEX "idx_jobs_run_id_state"
    ON "jobs" ("run_id", "state");
CREATE INDEX "idx_calls_trial_id"
    ON "calls" ("trial_id");
CREATE INDEX "idx_trials_run_id_status_outcome"
    ON "trials" ("run_id", "status", "outcome");
CREATE INDEX "idx_shared_jobs_run_id_kind_seq"
    ON "shared_jobs" ("run_id", "kind", "seq");
CREATE INDEX "idx_shared_claims_run_id_kind"
    ON "shared_claims" ("run_id", "kind");
COMMIT;

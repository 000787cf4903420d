BEGIN TRANSACTION;
CREATE TABLE calibrations (
	id INTEGER NOT NULL, 
	at DOUBLE, 
	judge TEXT, 
	model TEXT, 
	rubric_digest TEXT, 
	mae DOUBLE, 
	anchors BIGINT, 
	threshold DOUBLE, 
	reliable BIGINT, 
	PRIMARY KEY (id)
);
CREATE TABLE calls (
	id INTEGER NOT NULL, 
	run_id TEXT, 
	trial_id TEXT, 
	at DOUBLE, 
	provider TEXT, 
	wire TEXT, 
	method TEXT, 
	path TEXT, 
	model_requested TEXT, 
	model TEXT, 
	status BIGINT, 
	input_tokens BIGINT, 
	output_tokens BIGINT, 
	cache_read_tokens BIGINT, 
	cache_write_tokens BIGINT, 
	cost DOUBLE, 
	latency DOUBLE, 
	ttfb DOUBLE, 
	request_bytes BIGINT, 
	response_bytes BIGINT, 
	error TEXT, 
	refused BIGINT, 
	headers TEXT, 
	role TEXT, 
	PRIMARY KEY (id)
);
CREATE TABLE events (
	id INTEGER NOT NULL, 
	run_id TEXT, 
	trial_id TEXT, 
	at DOUBLE, 
	kind TEXT, 
	data TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "events" VALUES(1,'20260101-000000-0abc',NULL,1.79630653731173396108e+09,'recorded','{"trials": 4}');
INSERT INTO "events" VALUES(2,'20260101-000000-0abc','20260101-000000-0abc.00000',1.79630653733641076083e+09,'finished','{"outcome": "pass"}');
INSERT INTO "events" VALUES(3,'20260101-000000-0abc','20260101-000000-0abc.00001',1.79630653734502077102e+09,'finished','{"outcome": "infra_error"}');
INSERT INTO "events" VALUES(4,'20260101-000000-0abc','20260101-000000-0abc.00002',1.79630653735199785235e+09,'finished','{"outcome": "fail"}');
CREATE TABLE jobs (
	id TEXT NOT NULL, 
	run_id TEXT, 
	trial_id TEXT, 
	state TEXT, 
	lease_owner TEXT, 
	lease_expires DOUBLE, 
	heartbeat_at DOUBLE, 
	created_at DOUBLE, 
	PRIMARY KEY (id)
);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00000','20260101-000000-0abc','20260101-000000-0abc.00000','done',NULL,1.79630713732012271873e+09,1.79630653732012271883e+09,1.79630653730780720706e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00001','20260101-000000-0abc','20260101-000000-0abc.00001','done',NULL,1.79630713733974766736e+09,1.79630653733974766732e+09,1.79630653730780720706e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00002','20260101-000000-0abc','20260101-000000-0abc.00002','done',NULL,1.79630713734693241122e+09,1.79630653734693241123e+09,1.79630653730780720706e+09);
INSERT INTO "jobs" VALUES('20260101-000000-0abc.00003','20260101-000000-0abc','20260101-000000-0abc.00003','queued',NULL,NULL,NULL,1.79630653730780720706e+09);
CREATE TABLE judgments (
	id INTEGER NOT NULL, 
	run_id TEXT, 
	trial_id TEXT, 
	judge TEXT, 
	score DOUBLE, 
	rationale TEXT, 
	error TEXT, 
	calls BIGINT, 
	input_tokens BIGINT, 
	output_tokens BIGINT, 
	cost DOUBLE, 
	cost_known BIGINT, 
	duration DOUBLE, 
	PRIMARY KEY (id)
);
CREATE TABLE meta (
	"key" TEXT NOT NULL, 
	value TEXT, 
	PRIMARY KEY ("key")
);
INSERT INTO "meta" VALUES('schema_version','12');
CREATE TABLE placements (
	trial_id TEXT NOT NULL, 
	run_id TEXT, 
	engine TEXT, 
	address TEXT, 
	owner TEXT, 
	at DOUBLE, 
	PRIMARY KEY (trial_id)
);
CREATE TABLE runs (
	id TEXT NOT NULL, 
	name TEXT, 
	created_at DOUBLE, 
	status TEXT, 
	spec TEXT, 
	trials_dir TEXT, 
	schema_version BIGINT, 
	PRIMARY KEY (id)
);
INSERT INTO "runs" VALUES('20260101-000000-0abc','old-run',1.79630653730780720706e+09,'running','{"attempts": 1, "harnesses": {"nop": {}, "oracle": {}}, "name": "old-run"}','/srv/trials',12);
CREATE TABLE shared_claims (
	id TEXT NOT NULL, 
	run_id TEXT, 
	kind TEXT, 
	result TEXT, 
	trial_id TEXT, 
	at DOUBLE, 
	PRIMARY KEY (id)
);
CREATE TABLE shared_jobs (
	id TEXT NOT NULL, 
	run_id TEXT, 
	kind TEXT, 
	name TEXT, 
	seq BIGINT, 
	data TEXT, 
	updated_at DOUBLE, 
	PRIMARY KEY (id)
);
CREATE TABLE shared_locks (
	id TEXT NOT NULL, 
	owner TEXT, 
	expires_at DOUBLE, 
	PRIMARY KEY (id)
);
CREATE TABLE steps (
	id INTEGER NOT NULL, 
	run_id TEXT, 
	trial_id TEXT, 
	seq BIGINT, 
	name TEXT, 
	reward DOUBLE, 
	rewards TEXT, 
	exit_code BIGINT, 
	timed_out BIGINT, 
	duration DOUBLE, 
	error TEXT, 
	PRIMARY KEY (id)
);
CREATE TABLE trials (
	id TEXT NOT NULL, 
	run_id TEXT, 
	seq BIGINT, 
	plan_seq BIGINT, 
	item_id TEXT, 
	dataset TEXT, 
	task TEXT, 
	harness TEXT, 
	attempt BIGINT, 
	replaces TEXT, 
	retries BIGINT, 
	status TEXT, 
	outcome TEXT, 
	reward DOUBLE, 
	rewards TEXT, 
	exit_code BIGINT, 
	error TEXT, 
	started_at DOUBLE, 
	finished_at DOUBLE, 
	duration DOUBLE, 
	phases TEXT, 
	trial_dir TEXT, 
	worker TEXT, 
	calls BIGINT, 
	input_tokens BIGINT, 
	output_tokens BIGINT, 
	cache_read_tokens BIGINT, 
	cache_write_tokens BIGINT, 
	cost DOUBLE, 
	cost_known BIGINT, 
	usage_unknown BIGINT, 
	models TEXT, 
	other_model_tokens BIGINT, 
	stopped_by TEXT, 
	own_report TEXT, 
	judges TEXT, 
	error_class TEXT, 
	engine TEXT, 
	agent_user TEXT, 
	model TEXT, 
	kept_processes BIGINT, 
	cause TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "trials" VALUES('20260101-000000-0abc.00000','20260101-000000-0abc',0,0,'ds::alpha[oracle-1]','ds','alpha','oracle',1,NULL,NULL,'finished','pass',1.0,'{"reward": 1.0}',0,NULL,1.79630653732012271883e+09,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": null, "turns": 3, "final_message": null, "is_error": null, "is_estimate": false}','{}',NULL,NULL,'0:0 (root, image)',NULL,0,NULL);
INSERT INTO "trials" VALUES('20260101-000000-0abc.00001','20260101-000000-0abc',1,1,'ds::alpha[nop-1]','ds','alpha','nop',1,NULL,NULL,'finished','infra_error',NULL,'{}',0,'engine down',1.79630653733974766732e+09,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": null, "turns": 3, "final_message": null, "is_error": null, "is_estimate": false}','{}',NULL,NULL,'0:0 (root, image)',NULL,0,'engine_outage');
INSERT INTO "trials" VALUES('20260101-000000-0abc.00002','20260101-000000-0abc',2,2,'ds::beta[oracle-1]','ds','beta','oracle',1,NULL,NULL,'finished','fail',0.0,'{"reward": 0.0}',1,NULL,1.79630653734693241123e+09,1767225660.0,60.0,'{"agent": 45.0, "verify": 15.0}','ds/alpha/oracle-1','main@old-host:1',2,100,20,30,0,0.5,1,0,'["model-a"]',0,NULL,'{"input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": null, "turns": 3, "final_message": null, "is_error": null, "is_estimate": false}','{}','partial',NULL,'0:0 (root, image)',NULL,0,NULL);
INSERT INTO "trials" VALUES('20260101-000000-0abc.00003','20260101-000000-0abc',3,3,'ds::beta[nop-1]','ds','beta','nop',1,NULL,NULL,'planned',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE INDEX idx_trials_run_id_status_outcome ON trials (run_id, status, outcome);
CREATE INDEX idx_trials_run_id_plan_seq_seq ON trials (run_id, plan_seq, seq);
CREATE INDEX idx_jobs_run_id_state ON jobs (run_id, state);
CREATE INDEX idx_calls_trial_id ON calls (trial_id);
CREATE INDEX idx_events_kind_trial_id ON events (kind, trial_id);
CREATE INDEX idx_shared_jobs_run_id_kind_seq ON shared_jobs (run_id, kind, seq);
CREATE INDEX idx_shared_claims_run_id_kind ON shared_claims (run_id, kind);
COMMIT;
